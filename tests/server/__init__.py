"""Tests of bench/server/."""
