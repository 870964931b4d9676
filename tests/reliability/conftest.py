"""Reliability suite: crash, fault and bad-input tests (see docs/reliability.md)."""

from __future__ import annotations
