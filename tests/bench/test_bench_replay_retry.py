"""The RocketMQ replay through the faults of a master failover, as an application goes through
them: it retries a failed transactional send as a new transaction, answers the checks of a
failed attempt's stored half with ROLLBACK (an orphan), and answers a late check of a row it
has emitted from the row's remembered decision (its END lost).

A real broker in process listens on 127.0.0.2 and advertises 127.0.0.1, where a
:class:`FaultProxy` forwards to it, so the producers reach it only through the proxy.  The
proxy forwards the first half of a row and then cuts the connection carrying its answer, and
cuts every resend of that half (the SDK's own retries, same UNIQ_KEY): the half is stored, the
send fails with its outcome unknown.  The replay task runs through ``stream_task``, as in a
Spark task, on its own thread and loop."""

from __future__ import annotations

import asyncio
import dataclasses
import re
import time

import pytest
from support.consuming import collect

from txbroker.bench.chaos.faultproxy import FaultProxy
from txbroker.bench.chaos.process import free_port
from txbroker.bench.trace.replay import PROP_ATTEMPT, TaskParams, _ReplayWorker
from txbroker.bench.trace.spec import PROP_TX
from txbroker.bench.trace.tasks import now_ms, stream_task
from txbroker.broker import Broker
from txbroker.client import Consumer
from txbroker.client.admin import AdminClient
from txbroker.config import BrokerConfig

pytestmark = pytest.mark.slow

TOPIC = "BenchRetry"
#: A half's attempt property in a SEND request (header JSON escapes the separator).
ATTEMPT_RE = re.compile(rb"BENCH_ATTEMPT(?:\\u0001|\x01)(\d+)")
#: An END_TRANSACTION request (code 37) in a chunk from a producer.
END_RE = re.compile(rb'"code":37\b')
PRIVATE = "127.0.0.2"


def _row(i: int) -> dict:
    return {"id": i, "producer": 0, "topic": TOPIC, "keys": f"key-{i}", "tags": "TagA",
            "body_bytes": 16, "start_ms": 0, "local_tx_ms": 0, "kind": "commit",
            "first_decision": "commit", "check_answers": [], "expected_checks": 0,
            "expected_outcome": "commit", "messages": 1, "topics": [TOPIC], "crash": False,
            "restart_ms": None}


class LoseFirstAttempt:
    """``cut_when`` of the proxy: forward the first half of attempt 1, then lose its answer
    (cut the next broker->client chunk) and cut every resend of attempt 1 before the broker.
    ``every_attempt``: cut every half before the broker instead (nothing stored)."""

    def __init__(self, every_attempt: bool = False) -> None:
        self.every_attempt = every_attempt
        self.stored = False
        self.answer_lost = False

    def __call__(self, to_server: bool, chunk: bytes) -> bool:
        if to_server:
            m = ATTEMPT_RE.search(chunk)
            if m is None:
                return False
            if self.every_attempt:
                return True
            if m.group(1) != b"1":
                return False
            if not self.stored:
                self.stored = True
                return False
            return True
        if self.stored and not self.answer_lost:
            self.answer_lost = True
            return True
        return False


@pytest.fixture
async def proxied(broker_config: BrokerConfig):
    """(name server address, proxy): the broker reachable at the advertised 127.0.0.1 only through the proxy."""
    port = free_port()
    config = dataclasses.replace(broker_config, listen_host=PRIVATE, broker_port=port,
                                 advertised_host="127.0.0.1")
    broker = Broker(config)
    await broker.start()
    proxy = await FaultProxy(PRIVATE, port, listen_port=port).start()
    # The name server answers where it listens (it advertises 127.0.0.1 like the broker).
    namesrv = f"{PRIVATE}:{broker.namesrv_addr.rsplit(':', 1)[1]}"
    try:
        async with AdminClient(namesrv) as admin:
            await admin.create_topic(TOPIC, 4)
        yield namesrv, proxy
    finally:
        await proxy.close()
        await broker.stop()


def _replay(params: TaskParams, rows: list[dict]) -> tuple[list[tuple], _ReplayWorker]:
    """One replay task over ``rows``, as Spark runs it; the results and the worker."""
    workers: list[_ReplayWorker] = []

    async def worker(feed, emit) -> None:
        workers.append(_ReplayWorker(params, 0, emit))
        await workers[0].run(feed)

    return list(stream_task(rows, worker)), workers[0]


def _params(namesrv: str, **kw) -> TaskParams:
    return TaskParams(namesrv=namesrv, run_id="retry", epoch_ms=now_ms(), rate=0.0,
                      concurrency=4, settle_s=10.0, **kw)


async def test_a_failed_send_is_retried_and_its_stored_half_rolled_back(proxied):
    namesrv, proxy = proxied
    proxy.cut_when = LoseFirstAttempt()
    # linger: the row stays answerable long enough for the orphan's check (timeout 0.5 s,
    # a pass every 0.2 s, after the producer's next heartbeat on its new connection).
    t0 = time.monotonic()
    results, worker = await asyncio.to_thread(_replay, _params(namesrv, linger_s=6.0), [_row(0)])
    assert proxy.cut_when.stored and proxy.cut_when.answer_lost
    assert len(results) == 1
    (id_, _task, _sched, start, half, decided, _ret, first, final, checks, phases, error,
     abandoned, resolved, attempts) = results[0]
    assert (id_, error, first, final, attempts) == (0, None, "commit", "commit", 2), results[0]
    assert half >= start and decided >= half and abandoned is None and resolved is None
    assert checks == [] or set(phases) == {"running"}, results[0]  # none scripted
    assert worker.listener.orphan_checks >= 1, "the failed attempt's half was never checked"
    assert time.monotonic() - t0 < 60

    # Attempt 2 is delivered once; attempt 1's half was rolled back, never delivered.
    consumer = Consumer("CG_RETRY", namesrv, from_where="first",
                        long_poll_timeout=1.0, rebalance_interval=0.5, persist_interval=0.2)
    consumer.subscribe(TOPIC)
    async with consumer:
        got = await collect(consumer, 1)
        extra = await consumer.poll(2.0)
    assert extra is None, extra.properties
    assert (got[0].properties[PROP_TX], got[0].properties[PROP_ATTEMPT]) == ("0", "2")


async def test_a_send_that_keeps_failing_is_a_failed_send_after_the_attempts(proxied):
    namesrv, proxy = proxied
    proxy.cut_when = LoseFirstAttempt(every_attempt=True)
    results, worker = await asyncio.to_thread(
        _replay, _params(namesrv, linger_s=0.2, send_attempts=2), [_row(0)])
    (*_, error, _abandoned, _resolved, attempts) = results[0]
    assert attempts == 2 and error is not None, results[0]
    assert "message 0: transaction begun 2 time(s)" in error, error
    assert worker.listener.orphan_checks == 0


class LoseFirstEnd:
    """``cut_when`` of the proxy: cut the connection carrying the first END_TRANSACTION (a
    one-way request: the producer never learns it was lost)."""

    def __init__(self) -> None:
        self.cut = False

    def __call__(self, to_server: bool, chunk: bytes) -> bool:
        if to_server and not self.cut and END_RE.search(chunk):
            self.cut = True
            return True
        return False


async def test_a_forgotten_rows_decision_answers_a_late_check(proxied):
    """Row 0's END is lost (as with a master that dies before it arrives) and the row is
    emitted and forgotten before the broker checks its half back: the check is answered from
    the remembered decision, so the commit is delivered.  Row 1, due 4 s later, keeps the
    task (and its producer) alive meanwhile."""
    namesrv, proxy = proxied
    proxy.cut_when = LoseFirstEnd()
    rows = [_row(0), {**_row(1), "start_ms": 4000}]
    params = dataclasses.replace(_params(namesrv, linger_s=0.1), rate=None)
    results, worker = await asyncio.to_thread(_replay, params, rows)
    assert proxy.cut_when.cut
    by_id = {r[0]: r for r in results}
    assert by_id[0][8] == "commit" and by_id[0][9] == [], by_id[0]  # final; no check recorded
    assert worker.listener.late_checks >= 1, "the lost END's half was never checked back"

    consumer = Consumer("CG_LATE", namesrv, from_where="first",
                        long_poll_timeout=1.0, rebalance_interval=0.5, persist_interval=0.2)
    consumer.subscribe(TOPIC)
    async with consumer:
        got = await collect(consumer, 2)
        extra = await consumer.poll(1.0)
    assert extra is None, extra.properties
    assert sorted(m.properties[PROP_TX] for m in got) == ["0", "1"]
