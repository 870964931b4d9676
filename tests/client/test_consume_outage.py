"""A following ``txbroker consume`` across a broker outage: one line when the connection is lost,
one when it is back, whatever the number of queues and retries in between.

Everything is real: the broker is a subprocess, SIGKILLed and started again on the same port
and data directory, and the consumer is the ``txbroker consume`` command in a subprocess.
"""

from __future__ import annotations

import asyncio
import signal
import sys

import pytest
from support.cli_runner import default_sigint

from txbroker.bench.chaos.process import free_port
from txbroker.client import Message, Producer
from txbroker.client.admin import AdminClient
from txbroker.client.reachability import Reachability

#: How long the broker stays down: long enough for every retry path of the consumer (pulls
#: back off 1 s per queue, offsets are committed every 5 s) to have run several times.
OUTAGE = 8.0


async def _send(namesrv: str, topic: str, body: bytes) -> None:
    async with Producer("PG_OUTAGE", namesrv) as producer:
        await producer.send(Message(topic, body))


@pytest.mark.slow
async def test_following_consume_reports_an_outage_in_two_lines(broker_process) -> None:
    # A pinned port with the name server on it: a restart comes back at the same address.
    proc = broker_process(broker_port=free_port(), namesrv_port=-1)
    namesrv = proc.namesrv_addr
    async with AdminClient(namesrv) as admin:
        await admin.create_topic("TOutage", 4)
    await _send(namesrv, "TOutage", b"before")
    consume = await asyncio.create_subprocess_exec(
        sys.executable, "-P", "-m", "txbroker", "consume", "--topic", "TOutage", "--group",
        "CG_OUTAGE", "--from-beginning", "--namesrv", namesrv,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, preexec_fn=default_sigint)
    try:
        first = await asyncio.wait_for(consume.stdout.readline(), 30)
        assert first.decode().rstrip().endswith("before")
        proc.kill()
        await asyncio.sleep(OUTAGE)  # the outage itself: the consumer retries meanwhile
        await asyncio.to_thread(proc.start)
        assert proc.namesrv_addr == namesrv  # same port: the consumer finds it again
        await _send(namesrv, "TOutage", b"after")
        second = await asyncio.wait_for(consume.stdout.readline(), 30)
        assert second.decode().rstrip().endswith("after")
        consume.send_signal(signal.SIGINT)
        _, err_bytes = await asyncio.wait_for(consume.communicate(), 30)
    finally:
        if consume.returncode is None:
            consume.kill()
            await consume.wait()
    lines = err_bytes.decode().splitlines()
    assert lines[-1].startswith("consumed 2 messages of topic TOutage"), lines
    report = lines[:-1]
    assert len(report) == 2, "\n".join(report)
    assert "lost" in report[0] and namesrv in report[0], report
    assert "back" in report[1] and namesrv in report[1], report


def test_reachability_reports_each_outage_once() -> None:
    now = [100.0]
    r = Reachability(clock=lambda: now[0])
    addr = "127.0.0.1:10911"
    assert r.answered(addr) is None  # no outage: nothing to report
    assert not r.lost(addr, TimeoutError())  # slow is not gone
    assert r.lost(addr, ConnectionResetError("reset"))
    for _ in range(5):  # every retry of every queue meanwhile: already reported
        assert not r.lost(addr, ConnectionRefusedError("refused"))
    assert r.is_down(addr) and not r.is_down("127.0.0.1:10912")
    now[0] = 108.5
    assert r.answered(addr) == 8.5
    assert r.answered(addr) is None and not r.is_down(addr)
    assert r.lost(addr, ConnectionError("closed"))  # a second outage is a new report
