"""Consumer groups survive a broker crash: an exactly-once consume-transform-produce pipeline
(tests/support/kafka_group_pipeline.py, one transaction per 20 inputs) on librdkafka and on
aiokafka keeps committing when the broker (a ``txbroker serve`` process with a pinned Kafka
port) is SIGKILLed and restarted on the same data directory: its consumer's next heartbeat
finds the generation it knows, so the consumer keeps its partitions (no revoke, no "assignment
lost": a broker that forgot its groups answers UNKNOWN_MEMBER_ID and the group rebalances), no
commit is held up longer than the session timeout, and the output holds exactly one record per
input (read_committed)."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from support.kafka_e2e import E2E_SETTINGS, per_input, produce_inputs, read_topic

from txbroker.bench.chaos.process import free_port
from txbroker.client.admin import AdminClient

pytestmark = pytest.mark.slow

PIPELINE = Path(__file__).parent.parent / "support" / "kafka_group_pipeline.py"
INPUTS = 1000
PARTITIONS = 2
SESSION_MS = 10_000
#: Commits seen before the broker is killed.
COMMITS_BEFORE_KILL = 5


class Commits:
    """The app's ``committed <time> <inputs>`` lines, read as they come."""

    def __init__(self, proc: subprocess.Popen) -> None:
        self.rows: list[tuple[float, list[str]]] = []
        self.rebalances: list[str] = []
        self._thread = threading.Thread(target=self._read, args=(proc,), daemon=True)
        self._thread.start()

    def _read(self, proc: subprocess.Popen) -> None:
        for line in proc.stdout:
            if line.startswith("committed "):
                _, at, inputs = line.split(" ", 2)
                self.rows.append((float(at), json.loads(inputs)))
            elif line.startswith("rebalance "):
                self.rebalances.append(line.strip())

    def join(self) -> None:
        self._thread.join(10)


def start_app(client: str, bootstrap: str, log: Path) -> subprocess.Popen:
    with open(log, "ab") as err:
        return subprocess.Popen(
            [sys.executable, str(PIPELINE), client, bootstrap, "gr-in", "gr-out", "gr-app",
             f"gr-tid-{client}", "--session-ms", str(SESSION_MS), "--delay", "0.1",
             "--idle-exit", "6"], stdout=subprocess.PIPE, stderr=err, text=True)


async def _wait(pred, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < deadline, what
        await asyncio.sleep(0.05)


@pytest.mark.parametrize("client", ["rdkafka", "aiokafka"])
async def test_eos_pipeline_keeps_committing_across_a_broker_sigkill(broker_process, tmp_path,
                                                                     client):
    port = free_port()
    broker = broker_process(kafka_port=port, **E2E_SETTINGS)
    bootstrap = broker.kafka_addr
    async with AdminClient(broker.namesrv_addr) as admin:
        for topic in ("gr-in", "gr-out"):
            await admin.create_topic(topic, PARTITIONS)
    inputs = await produce_inputs(bootstrap, "gr-in", INPUTS)
    log = tmp_path / "app.log"
    proc = start_app(client, bootstrap, log)
    commits = Commits(proc)
    try:
        await _wait(lambda: len(commits.rows) >= COMMITS_BEFORE_KILL, 60,
                    f"the app committed {len(commits.rows)} transactions")
        killed_at = time.time()
        broker.kill()
        broker.start()
        assert broker.kafka_addr == bootstrap
        code = await asyncio.wait_for(asyncio.to_thread(proc.wait), 180)
        commits.join()
        assert code == 0, log.read_text()[-3000:]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    assert commits.rebalances == [], commits.rebalances   # the group outlived the broker
    times = [at for at, _ in commits.rows]
    after = [at for at in times if at > killed_at]
    assert after, "nothing was committed after the broker restart"
    # the longest wait for a commit, from the kill on: within the session timeout
    stalls = [b - a for a, b in zip([killed_at] + after, after, strict=False)]
    assert max(stalls) < SESSION_MS / 1000, (max(stalls), log.read_text()[-3000:])
    committed = await read_topic(bootstrap, "gr-out", "read_committed", PARTITIONS)
    counts = per_input(committed)
    missing = [v for v in inputs if counts[v] == 0]
    twice = {v: n for v, n in counts.items() if n != 1}
    assert not missing and not twice, (len(missing), missing[:10], list(twice.items())[:10])
    assert len(committed) == INPUTS
