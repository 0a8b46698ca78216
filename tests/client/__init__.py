"""Tests of bench/client/."""
