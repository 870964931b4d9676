"""A broker process SIGKILLed between a 5.x SimpleConsumer's receive and its acks: restarted on
its data directory, it delivers again exactly the messages that were not acknowledged."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.slow


async def test_sigkill_between_receive_and_ack_redelivers_only_the_unacked(
        broker_process, py5, py5_consumer) -> None:
    proc = broker_process(grpc_port=0)
    await py5("send", proc.grpc_addr, "G5Kill", 4)
    first = await py5_consumer("receive", proc.grpc_addr, "G5Kill", "GID_KILL5", 4,
                               "--ack-first", 2, "--invisible", 3)
    bodies = [e["got"] for e in first if "got" in e]
    acked = [e["acked"] for e in first if "acked" in e]
    assert sorted(bodies) == [f"m-{i}" for i in range(4)] and len(acked) == 2
    proc.kill()
    proc.restart()
    second = await py5_consumer("receive", proc.grpc_addr, "G5Kill", "GID_KILL5", 2,
                                "--invisible", 30, "--quiet", 4)
    again = [(e["got"], e["attempt"]) for e in second if "got" in e]
    assert sorted(again) == sorted((b, 2) for b in bodies if b not in acked)
    assert [e for e in second if "extra" in e] == []
