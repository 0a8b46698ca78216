"""Tests of bench/sim/."""
