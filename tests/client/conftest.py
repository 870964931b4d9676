"""Fixtures for SDK tests (helpers live in sdk_helpers.py)."""

from __future__ import annotations

import pytest


@pytest.fixture
def namesrv(broker) -> str:
    return broker.namesrv_addr
