"""The README's "RocketMQ 5.x clients" commands, run as tests/test_readme.py runs its sections,
against a ``txbroker serve`` whose gRPC port stands in for 8081."""

from __future__ import annotations

import re

import pytest

from tests.test_readme import commands, run_in_order, scratch_checkout, section
from txbroker.bench.chaos.process import free_port

pytestmark = pytest.mark.slow


def test_readme_rocketmq5_section_runs_as_written(broker_process, tmp_path) -> None:
    text = section("## RocketMQ 5.x clients")
    assert re.search(r"txbroker serve --segment-size \S+ --grpc-port 8081", text)
    broker = broker_process(grpc_port=free_port())
    lines = [line.replace("127.0.0.1:8081", broker.grpc_addr)
             for line in commands("## RocketMQ 5.x clients")]
    assert lines[0].startswith(".venv/bin/python examples/grpc_quickstart.py --endpoint ")
    results = run_in_order(lines, scratch_checkout(tmp_path), broker.namesrv_addr)
    out = results[0][1]
    assert "ok: 2 messages read and acknowledged, the rolled-back one never" in out, out
    assert "rolled back" in out and "(rolled back)' (attempt" not in out
    assert "0 pending or discarded half message(s)" in results[1][1], results[1][1]
