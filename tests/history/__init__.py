"""Tests of bench/history/."""
