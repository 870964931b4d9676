"""Operators' view of Kafka transactions: ``txbroker txn list/show/abort`` against a real broker
with its Kafka listener, a real aiokafka transactional producer holding a transaction open, and
the real CLI (in process, tests/support/cli_runner.py).

The broker's timeout scan is set far apart (an hour) so that the open transaction stays open
past its 1 s timeout: that is what ``--hanging`` finds (kafka-transactions.sh find-hanging);
the test then aborts it as an operator and checks its producer is fenced and none of its
records is ever visible."""

from __future__ import annotations

import orjson
import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.errors import KafkaError
from support.cli_runner import cli_ok, cli_one_line_error, run_cli
from support.waiting import eventually

from txbroker.bench.chaos.process import free_port
from txbroker.client.admin import AdminClient
from txbroker.client.errors import LocatedError

TOPIC = "ops-orders"
TID = "ops-app-1"


@pytest.fixture
def kafka_config(kafka_config):
    return kafka_config.replace(kafka_transaction_scan_interval=3600.0)


async def _committed_values(bootstrap: str) -> list[bytes]:
    """Every value a read_committed consumer reads from the topic's partition 0 (to the end)."""
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=None,
                                isolation_level="read_committed", auto_offset_reset="earliest")
    await consumer.start()
    try:
        tp = TopicPartition(TOPIC, 0)
        consumer.assign([tp])
        end = (await consumer.end_offsets([tp]))[tp]
        values: list[bytes] = []
        while await consumer.position(tp) < end:
            for records in (await consumer.getmany(timeout_ms=500)).values():
                values += [r.value for r in records]
        return values
    finally:
        await consumer.stop()


async def test_list_show_hanging_and_abort_of_an_open_kafka_transaction(kafka_broker, kafka_bootstrap):
    ns = ("--namesrv", kafka_broker.namesrv_addr)
    async with AdminClient(kafka_broker.namesrv_addr) as admin:
        await admin.create_topic(TOPIC, 1)
    # no Kafka transaction yet: the list is the halves' table only, --hanging is empty
    assert "Kafka" not in cli_ok(await run_cli("txn", "list", *ns))
    assert "0 hanging Kafka transaction(s)" in cli_ok(await run_cli("txn", "list", "--hanging", *ns))

    producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap, transactional_id=TID,
                                transaction_timeout_ms=1000)
    await producer.start()
    try:
        plain = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap)
        await plain.start()
        await plain.send_and_wait(TOPIC, b"plain-1", partition=0)
        await plain.stop()
        await producer.begin_transaction()
        await (await producer.send(TOPIC, b"open-1", partition=0))
        await (await producer.send(TOPIC, b"open-2", partition=0))

        table = cli_ok(await run_cli("txn", "list", *ns))
        assert "1 open Kafka transaction(s)" in table and TID in table and "Ongoing" in table
        assert f"{TOPIC}-0" in table
        rows = [r for r in orjson.loads(cli_ok(await run_cli("txn", "list", "--json", *ns)))
                if r.get("kind") == "kafka"]
        assert len(rows) == 1
        row = rows[0]
        assert row["transactional_id"] == TID and row["state"] == "Ongoing"
        assert row["partitions"] == [[TOPIC, 0]] and row["timeout_ms"] == 1000
        assert row["producer_id"] >= 0 and row["producer_epoch"] >= 0 and row["age_ms"] >= 0
        epoch = row["producer_epoch"]
        # --state means the same for both kinds: open is "pending", so "all" has it too, and
        # no Kafka transaction is ever "discarded"
        assert TID in cli_ok(await run_cli("txn", "list", "--state", "all", *ns))
        assert orjson.loads(cli_ok(await run_cli("txn", "list", "--state", "discarded", "--json", *ns))) == []
        assert "Kafka" not in cli_ok(await run_cli("txn", "list", "--state", "discarded", *ns))

        # commit, rollback and resume are half-message decisions: they point to abort
        for decision in ("commit", "rollback", "resume"):
            err = cli_one_line_error(await run_cli("txn", decision, TID, "--operator", "bob", *ns))
            assert err == (f"error: txn {decision} at {kafka_broker.broker_addr}: {TID} is a Kafka "
                           "transactional id, not a half message: an operator can only abort a "
                           f"Kafka transaction: txbroker txn abort {TID}"), err
        assert orjson.loads(cli_ok(await run_cli("txn", "show", TID, "--json", *ns)))["state"] == "Ongoing"

        # past its 1 s timeout (the scan that would abort it runs once an hour): hanging
        async def hanging() -> list[dict]:
            out = cli_ok(await run_cli("txn", "list", "--hanging", "--json", *ns))
            return [r for r in orjson.loads(out) if r["transactional_id"] == TID]

        await eventually(hanging, msg="the open transaction is listed as hanging")
        out = cli_ok(await run_cli("txn", "list", "--hanging", *ns))
        assert "1 hanging Kafka transaction(s)" in out and TID in out and "yes" in out

        shown = cli_ok(await run_cli("txn", "show", TID, *ns))
        assert "Kafka transaction" in shown and "Ongoing" in shown and "hanging" in shown
        assert f"{TOPIC}-0" in shown and f"producer epoch    {epoch}" in shown
        doc = orjson.loads(cli_ok(await run_cli("txn", "show", TID, "--json", *ns)))
        assert doc["kind"] == "kafka" and doc["hanging"] is True

        line = cli_ok(await run_cli("txn", "abort", TID, "--operator", "alice", *ns)).strip()
        assert "\n" not in line and line.startswith(f"abort {TID}: done") and "alice" in line
        after = orjson.loads(cli_ok(await run_cli("txn", "show", TID, "--json", *ns)))
        assert after["state"] != "Ongoing" and after["producer_epoch"] > epoch
        assert not after["hanging"]
        # the producer is fenced: its commit fails, and nothing of it is ever visible
        with pytest.raises(KafkaError):
            await producer.commit_transaction()
    finally:
        await producer.stop()
    assert await _committed_values(kafka_bootstrap) == [b"plain-1"]
    again = cli_ok(await run_cli("txn", "abort", TID, "--operator", "alice", *ns)).strip()
    assert again.startswith(f"abort {TID}: no open transaction") and "nothing changed" in again
    # aborted: no longer open, so listed only among every transactional id
    assert "Kafka" not in cli_ok(await run_cli("txn", "list", "--state", "all", *ns))
    assert "open Kafka" not in cli_ok(await run_cli("txn", "list", *ns))
    every = cli_ok(await run_cli("txn", "list", "--kafka-all", *ns))
    assert "1 Kafka transaction(s)" in every and TID in every


async def test_txn_help_names_both_kinds_and_abort():
    out = cli_ok(await run_cli("txn", "--help"))
    # the group's own description, not only the command list below it
    description = out.partition("\n\n")[2].partition("Options:")[0]
    assert "abort" in description and "Kafka" in description, description
    assert "txn abort" in cli_ok(await run_cli("txn", "commit", "--help"))


async def test_unknown_transactional_id_is_a_one_line_error(kafka_broker):
    ns = ("--namesrv", kafka_broker.namesrv_addr)
    err = cli_one_line_error(await run_cli("txn", "abort", "nobody-knows-me", *ns))
    assert "nobody-knows-me" in err
    err = cli_one_line_error(await run_cli("txn", "show", "nobody-knows-me", *ns))
    assert "nobody-knows-me" in err


async def test_a_broker_without_the_kafka_listener_lists_no_kafka_transactions(broker):
    ns = ("--namesrv", broker.namesrv_addr)
    assert orjson.loads(cli_ok(await run_cli("txn", "list", "--hanging", "--json", *ns))) == []
    cli_one_line_error(await run_cli("txn", "abort", "some-app", *ns))


@pytest.mark.slow
def test_readme_kafka_clients_section_runs_as_written(broker_process, tmp_path):
    """The README's "Kafka clients" commands, run as tests/test_readme.py runs its sections,
    against a ``txbroker serve`` whose Kafka port stands in for 9092."""
    from test_readme import commands, run_in_order, scratch_checkout

    broker = broker_process(kafka_port=free_port())
    lines = [line.replace("127.0.0.1:9092", broker.kafka_addr) for line in commands("## Kafka clients")]
    assert lines[0].startswith(".venv/bin/python examples/kafka_quickstart.py --bootstrap ")
    results = run_in_order(lines, scratch_checkout(tmp_path), broker.namesrv_addr)
    assert "ok: 4 committed messages read, the aborted one never" in results[0][1]
    assert "read_committed consumer got" in results[0][1] and "(aborted)" not in results[0][1]
    assert "1 Kafka transaction(s)" in results[1][1]
    assert "0 hanging Kafka transaction(s)" in results[2][1]


async def test_operator_abort_needs_an_admin_account_under_acl(kafka_config, tmp_path):
    """KAFKA_TXN_ABORT fences a producer: under ACL only an admin account may send it, as
    TXN_DECIDE; listing is not refused."""
    from txbroker.broker import Broker
    from txbroker.client.errors import BrokerError

    acl = tmp_path / "plain_acl.yml"
    acl.write_text("accounts:\n  - accessKey: app-key\n    secretKey: app-secret\n"
                   "    defaultTopicPerm: PUB|SUB\n"
                   "  - accessKey: admin-key\n    secretKey: admin-secret\n    admin: true\n")
    b = Broker(kafka_config.replace(acl_file=str(acl)))
    await b.start()
    try:
        app = {"access_key": "app-key", "secret_key": "app-secret"}
        async with AdminClient(b.namesrv_addr, **app) as admin:
            assert await admin.kafka_txn_list() == []
            with pytest.raises(BrokerError, match="Need admin permission for request code=9006"):
                await admin.kafka_txn_abort("some-app", "mallory")
        async with AdminClient(b.namesrv_addr, access_key="admin-key", secret_key="admin-secret") as admin:
            with pytest.raises(LocatedError, match="no transaction some-app"):
                await admin.kafka_txn_abort("some-app", "alice")
    finally:
        await b.stop()
