"""Test support shared by every test directory: waiting on state, a manual clock, and the
harnesses several test modules drive (tests import these, never each other)."""
