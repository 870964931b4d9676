"""``bench.broker`` at a tiny size: each kind of row (committed transactions, plain sends,
consumer delivery of a preloaded backlog) and each client kind runs against a real
``txbroker serve`` and prints every figure, with values that can be true (the benchmark itself
is not timed)."""

from __future__ import annotations

import argparse

import pytest

from txbroker.bench.broker import (
    BrokerProc,
    Row,
    format_row,
    main,
    preload,
    rows_of,
    run_delivery,
    run_row,
)
from txbroker.bench.remoting import echo_ceiling

pytestmark = pytest.mark.slow  # several broker processes and an echo process: about 10 s


def _figures(line: str, row: Row) -> list[str]:
    flush, kind, client, producers, sharing, workers, tls, *figures = line.split()
    assert (flush, kind, client, producers, sharing, workers, tls) == (
        row.flush, row.kind, row.client, str(row.producers), row.sharing, str(row.workers),
        "on" if row.tls else "off")
    return figures


@pytest.mark.parametrize("kind, client, sharing", [
    ("tx", "raw", "each"), ("tx", "sdk", "shared"), ("plain", "raw", "shared"),
    ("plain", "sdk", "each")])
async def test_send_row_prints_sane_figures(tmp_path, kind: str, client: str, sharing: str) -> None:
    echo = await echo_ceiling(4, 1, 0.2)
    assert echo[0] > 0 and echo[1] > 0
    with BrokerProc("async", str(tmp_path)) as broker:
        result = await run_row(broker, kind, client, 4, sharing == "shared", 0.4, 5000, echo)
    assert 0 < result.seen == result.sent <= 5000
    assert result.tps > 0 and 0 < result.p50_ms <= result.p99_ms
    assert result.broker_us > 0 and result.client_us > 0
    assert result.echo_rate > 0 and result.echo_cpu > 0

    row = Row("async", kind, client, 4, sharing)
    messages, tps, p50, p99, broker_us, client_us, rate, cpu = (
        float(f.replace(",", "")) for f in _figures(format_row(row, result), row))
    assert messages == result.seen and tps > 0 and p99 >= p50 > 0
    assert broker_us > 0 and client_us > 0 and rate > 0 and cpu > 0


@pytest.mark.parametrize("client", ["raw", "sdk"])
async def test_delivery_row_drains_the_whole_backlog(tmp_path, client: str) -> None:
    echo = await echo_ceiling(4, 1, 0.2)
    opened: list[bool] = []
    with BrokerProc("async", str(tmp_path)) as broker:
        result = await run_delivery(broker, client, 2000, 32, echo, lambda: opened.append(True))
    assert opened == [True]
    assert result.sent == result.seen == 2000
    # The broker's CPU is counted in 10 ms clock ticks, which a tiny backlog may not fill.
    assert result.tps > 0 and result.broker_us >= 0 and result.client_us > 0
    assert result.p50_ms == result.p99_ms == 0  # no send latency in a delivery row

    row = Row("async", "delivery", client, 1, "-")
    messages, tps, p50, p99, *rest = _figures(format_row(row, result), row)
    assert (messages, p50, p99) == ("2,000", "-", "-")
    assert float(tps.replace(",", "")) > 0 and all(float(f) >= 0 for f in rest)


async def test_preload_stores_the_backlog_in_every_queue(tmp_path) -> None:
    """Batches rotate over the queues, and a backlog that is no multiple of a batch is exact."""
    from txbroker.bench import broker as bench

    with BrokerProc("async", str(tmp_path)) as broker:
        await bench._create_topic(broker.addr)
        assert await preload(broker.addr, 1000) == 1000
        from txbroker.remoting.client import RemotingClient
        from txbroker.remoting.codes import RequestCode
        from txbroker.remoting.command import RemotingCommand

        client = RemotingClient(broker.addr)
        await client.connect()
        try:
            ends = []
            for qid in range(bench.QUEUES):
                resp = await client.invoke(RemotingCommand.request(
                    RequestCode.GET_MAX_OFFSET, {"topic": bench.TOPIC, "queueId": str(qid)}), 5)
                ends.append(int(resp.ext_fields["offset"]))
        finally:
            await client.close()
    assert sum(ends) == 1000 and all(e > 0 for e in ends)


def test_rows_cover_every_kind_and_delivery_has_one_consumer() -> None:
    args = argparse.Namespace(kind="tx,plain,delivery", flush="async", client="raw,sdk",
                              producers="1,64", connections="each,shared", workers="1",
                              tls="off")
    rows = rows_of(args)
    assert {r.kind for r in rows} == {"tx", "plain", "delivery"}
    assert [r for r in rows if r.kind == "delivery"] == [
        Row("async", "delivery", "raw", 1, "-"), Row("async", "delivery", "sdk", 1, "-")]
    assert len([r for r in rows if r.kind == "plain"]) == 6  # 2 clients × (1, 64 each, 64 shared)
    with pytest.raises(SystemExit):
        main(["--kind", "nonsense"])


@pytest.mark.parametrize("client", ["raw", "sdk"])
async def test_two_workers_row_loads_both_and_counts_their_cpu(tmp_path, client: str) -> None:
    """--workers 2: producers reach both workers (each worker's queues hold messages) and the
    broker CPU is the supervisor's and both workers'."""
    from txbroker.bench import broker as bench
    from txbroker.remoting.client import RemotingClient
    from txbroker.remoting.codes import RequestCode
    from txbroker.remoting.command import RemotingCommand

    echo = await echo_ceiling(4, 1, 0.2)
    with BrokerProc("async", str(tmp_path), workers=2) as broker:
        assert len(broker.addrs) == 2 and len(broker.worker_pids) == 2
        result = await run_row(broker, "tx", client, 4, False, 0.5, 2000, echo)
        stored = []
        for addr in broker.addrs:
            conn = RemotingClient(addr)
            await conn.connect()
            try:
                ends = [int((await conn.invoke(RemotingCommand.request(
                    RequestCode.GET_MAX_OFFSET, {"topic": bench.TOPIC, "queueId": str(q)}), 5)
                ).ext_fields["offset"]) for q in range(bench.QUEUES)]
            finally:
                await conn.close()
            stored.append(sum(ends))
        own = bench.proc_cpu_seconds(broker.proc.pid)
        assert broker.cpu() > own  # the workers' CPU is counted too
    assert 0 < result.seen == result.sent == sum(stored)
    assert all(n > 0 for n in stored), stored  # both workers took transactions
    assert result.broker_us > 0


def test_rows_with_workers_side_by_side_and_delivery_on_one_broker() -> None:
    args = argparse.Namespace(kind="tx,delivery", flush="async", client="raw",
                              producers="64", connections="each", workers="1,2", tls="off")
    assert rows_of(args) == [Row("async", "tx", "raw", 64, "each", 1),
                             Row("async", "tx", "raw", 64, "each", 2),
                             Row("async", "delivery", "raw", 1, "-")]
