"""Reliability suite: crash, fault and bad-input tests (see docs/reliability.md)."""

from __future__ import annotations


def pytest_configure(config) -> None:
    config.addinivalue_line("markers", "chaos: broker SIGKILLed under transactional load (short CI run)")
