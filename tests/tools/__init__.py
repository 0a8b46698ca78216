"""Tests of bench/tools/."""
