"""The unmodified RocketMQ 5.x Python client producing to txbroker's gRPC endpoint: normal,
FIFO and transactional sends, commit, rollback, and an orphaned transaction whose producer
process was SIGKILLed, recovered by a new producer instance answering the check-back."""

from __future__ import annotations

import orjson
import pytest

from tests.grpc.conftest import grpc_endpoint, visible
from tests.support.cli_runner import cli_ok, run_cli
from tests.support.waiting import eventually
from txbroker.store.record import PROPERTY_KEYS, PROPERTY_TAGS, PROPERTY_UNIQ_KEY

pytestmark = pytest.mark.slow


async def test_normal_sends_are_stored_with_their_properties(grpc_broker, py5) -> None:
    events = await py5("send", grpc_endpoint(grpc_broker), "G5Normal", 5, "--tag", "red")
    sent = [e["sent"] for e in events if "sent" in e]
    assert len(sent) == 5
    stored = visible(grpc_broker, "G5Normal")
    assert sorted(m.properties[PROPERTY_UNIQ_KEY] for m in stored) == sorted(sent)
    by_body = {m.body.decode(): m for m in stored}
    assert set(by_body) == {f"m-{i}" for i in range(5)}
    m3 = by_body["m-3"]
    assert m3.properties[PROPERTY_TAGS] == "red" and m3.properties[PROPERTY_KEYS] == "k3"
    assert m3.properties["n"] == "3"


async def test_fifo_messages_of_one_group_share_a_queue_in_order(grpc_broker, py5) -> None:
    await py5("send", grpc_endpoint(grpc_broker), "G5Fifo", 8, "--group", "order-42")
    stored = visible(grpc_broker, "G5Fifo")
    assert len({m.queue_id for m in stored}) == 1
    assert [m.body.decode() for m in sorted(stored, key=lambda m: m.queue_offset)] == \
        [f"m-{i}" for i in range(8)]
    assert all(m.properties["__SHARDINGKEY"] == "order-42" for m in stored)


async def test_committed_transactions_become_visible_rolled_back_never(grpc_broker, py5) -> None:
    endpoint = grpc_endpoint(grpc_broker)
    committed = await py5("tx", endpoint, "G5Tx", 3, "--end", "commit", "--prefix", "c")
    rolled_back = await py5("tx", endpoint, "G5Tx", 3, "--end", "rollback", "--prefix", "r")
    bodies = sorted(m.body.decode() for m in visible(grpc_broker, "G5Tx"))
    assert bodies == ["c-0", "c-1", "c-2"]
    assert grpc_broker.tx.pending_count() == 0
    # The same transactions the operator sees (txn show), decided by the producer.
    for events, state in ((committed, "committed"), (rolled_back, "rolled_back")):
        for e in (e for e in events if "half" in e):
            row = grpc_broker.tx.show(e["transaction_id"])
            assert (row["state"], row["source"], row["producer_group"]) == (state, "producer", "G5Tx")


async def test_an_orphaned_transaction_is_recovered_by_a_new_producer(grpc_broker, py5) -> None:
    """The producer process dies (SIGKILL) with its halves open; a new producer instance of the
    same topic gets the check-back on its Telemetry stream and commits."""
    endpoint = grpc_endpoint(grpc_broker)
    doomed = await py5.start("tx", endpoint, "G5Orphan", 2, "--end", "none", "--prefix", "o")
    events = await py5.events_until(doomed, "ended", 2)
    halves = {e["half"] for e in events if "half" in e}
    doomed.kill()
    await doomed.wait()
    assert visible(grpc_broker, "G5Orphan") == []
    assert grpc_broker.tx.pending_count() == 2

    checks = await py5("check", endpoint, "G5Orphan", 2, "--answer", "commit")
    assert {e["check"] for e in checks if "check" in e} >= halves
    await eventually(lambda: len(visible(grpc_broker, "G5Orphan")) == 2, timeout=20)
    assert sorted(m.body.decode() for m in visible(grpc_broker, "G5Orphan")) == ["o-0", "o-1"]
    assert grpc_broker.tx.pending_count() == 0
    for e in (e for e in events if "half" in e):
        assert grpc_broker.tx.show(e["transaction_id"])["source"] == "check"


async def test_an_operator_lists_and_commits_a_grpc_half_from_the_cli(grpc_config, py5) -> None:
    """A half sent over gRPC is one of the broker's transactions: ``txn list`` shows it (its
    producer group is its topic) and ``txn commit`` decides it for a producer that is gone."""
    from txbroker.broker import Broker

    # No check-back meanwhile: the operator decides.
    broker = Broker(grpc_config.replace(transaction_timeout=3600.0))
    await broker.start()
    try:
        doomed = await py5.start("tx", grpc_endpoint(broker), "G5Op", 1, "--end", "none",
                                 "--prefix", "op")
        events = await py5.events_until(doomed, "ended")
        half = next(e for e in events if "half" in e)
        doomed.kill()
        await doomed.wait()
        ns = ("--namesrv", broker.namesrv_addr)
        rows = orjson.loads(cli_ok(await run_cli("txn", "list", "--json", *ns)))
        row = next(r for r in rows if r["topic"] == "G5Op")
        assert (row["id"], row["producer_group"]) == (half["half"], "G5Op")
        cli_ok(await run_cli("txn", "commit", half["transaction_id"], "--operator", "alice", *ns))
        assert [m.body for m in visible(broker, "G5Op")] == [b"op-0"]
        assert broker.tx.show(half["transaction_id"])["source"] == "operator"
    finally:
        await broker.stop()
