"""POP state after a broker process is SIGKILLed: no unacknowledged message lost, no
acknowledged one delivered again, a FIFO queue still locked, handles still valid."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import orjson
import pytest
from support.pop_node import GROUP, config

from txbroker.broker import Broker
from txbroker.service.pop import PopError

NODE = Path(__file__).parent.parent / "support" / "pop_node.py"


def run_and_kill(data_dir: Path) -> dict[str, str]:
    """Start the node, read its handles, SIGKILL it."""
    proc = subprocess.Popen([sys.executable, str(NODE), str(data_dir)], stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL)
    try:
        line = proc.stdout.readline()   # the node prints within seconds, or exits and EOFs
        assert line, f"pop node exited ({proc.poll()}) before printing its handles"
        handles = orjson.loads(line)
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL
    return handles


async def receive(pop, topic: str, seconds: float, **kw) -> list:
    got: list = []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        got += await pop.pop(GROUP, topic, poll_ms=300, invisible_ms=60_000, **kw)
    return got


@pytest.mark.slow
async def test_pop_state_after_sigkill_loses_nothing_and_redelivers_no_ack(tmp_path) -> None:
    data = tmp_path / "data"
    handles = run_and_kill(data)
    b = Broker(config(str(data)))
    await b.start()
    try:
        pop = b.pop
        for body in ("m0", "m2", "m4"):
            with pytest.raises(PopError, match="already acknowledged"):
                await pop.ack(GROUP, handles[body])
        # m1 and m3 come back once their 3 s end, with attempt 2; m5 stays invisible; the
        # acknowledged ones never come.
        got = await receive(pop, "TKill", 6.0, batch_size=6)
        assert sorted((p.message.body, p.attempt) for p in got) == [(b"m1", 2), (b"m3", 2)]
        for p in got:
            await pop.ack(GROUP, p.handle)
        assert b.store.offsets.get(GROUP, "TKill", 0) == 5      # m5 still in flight
        await pop.ack(GROUP, handles["m5"])                     # its handle survived
        assert b.store.offsets.get(GROUP, "TKill", 0) == 6
        # The FIFO queue is still locked by f0 ...
        assert await pop.pop(GROUP, "TKillFifo", invisible_ms=60_000, fifo=True,
                             poll_ms=300) == []
        # ... until f0 turns visible: then f0 again, and only after its ack, f1.
        await pop.change_invisible(GROUP, handles["f0"], 100)
        [f0] = await receive(pop, "TKillFifo", 3.0, fifo=True, batch_size=1)
        assert (f0.message.body, f0.attempt) == (b"f0", 2)
        await pop.ack(GROUP, f0.handle)
        [f1] = await pop.pop(GROUP, "TKillFifo", invisible_ms=60_000, fifo=True, poll_ms=3000)
        assert (f1.message.body, f1.attempt) == (b"f1", 1)
    finally:
        await b.stop()
