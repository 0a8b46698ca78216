"""Tests of bench/measure/."""
