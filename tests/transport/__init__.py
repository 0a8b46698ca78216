"""Tests of bench/transport/."""
