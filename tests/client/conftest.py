"""Fixtures for SDK tests (shared helpers live in tests/support)."""

from __future__ import annotations

import pytest


@pytest.fixture
def namesrv(broker) -> str:
    return broker.namesrv_addr
