"""Tests of bench/report/."""
