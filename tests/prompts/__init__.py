"""Tests of bench/prompts/."""
