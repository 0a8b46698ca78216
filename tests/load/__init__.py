"""Tests of bench/load/."""
