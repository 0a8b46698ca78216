"""Tests of bench/cli/."""
