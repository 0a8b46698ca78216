"""Tests of bench/session/."""
