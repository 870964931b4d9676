"""Decided transactions through the real CLI and AdminClient: ``txn show`` answers from the
broker's decision history (who decided, when), a repeated decision is idempotent, a
contradicting one is refused with TRANSACTION_FAILED, and the history survives restarts."""

from __future__ import annotations

import re
import time

import orjson
import pytest
from support.cli_runner import cli_ok, run_cli
from support.waiting import eventually

from txbroker.client import (
    LocalTransactionState,
    Message,
    TransactionListener,
    TransactionProducer,
)
from txbroker.client.admin import AdminClient, TransactionNotFoundError
from txbroker.client.errors import BrokerError
from txbroker.config import BrokerConfig
from txbroker.remoting.codes import ResponseCode
from txbroker.store.record import OP_HALF_TOPIC

#: Fields of ``txn show --json`` that describe the decision and must survive a restart.
DECISION_FIELDS = ("state", "source", "operator", "prepared_at", "decided_at", "topic", "keys",
                   "producer_group", "offset_msg_id")


@pytest.fixture
def broker_config(broker_config: BrokerConfig) -> BrokerConfig:
    """The shared test settings, with the check service giving up after two checks."""
    return broker_config.replace(transaction_check_max=2)


class ByBody(TransactionListener):
    """Leaves every transaction open; a check-back commits ``check`` and never decides the rest."""

    def execute_local_transaction(self, msg, arg):
        return LocalTransactionState.UNKNOW

    def check_local_transaction(self, msg):
        return LocalTransactionState.COMMIT_MESSAGE if msg.body == b"check" else LocalTransactionState.UNKNOW


async def _produce(ns: tuple[str, str], decision: str, keys: str) -> str:
    """A transactional message through the CLI; returns its transaction id."""
    out = cli_ok(await run_cli("produce", "--topic", "THist", "--body", decision, "--keys", keys,
                         "--transactional", "--decision", decision, "--json", *ns))
    return orjson.loads(out)["transaction_id"]


async def _show(ns: tuple[str, str], txn_id: str) -> dict:
    return orjson.loads(cli_ok(await run_cli("txn", "show", txn_id, "--json", *ns)))


def _refusal(result) -> str:
    """The one stderr line of a refused ``txn`` command (exit 1), without ``error: ``."""
    assert result.exit_code == 1, (result.exit_code, result.output)
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    return lines[0].removeprefix("error: ")


def _line(out: str, label: str) -> str:
    m = re.search(rf"^{label}\s+(.*)$", out, re.MULTILINE)
    assert m, (label, out)
    return m.group(1)


async def test_repeated_decision_is_idempotent_and_a_contradicting_one_refused(broker, namesrv) -> None:
    ns = ("--namesrv", namesrv)
    a = await _produce(ns, "unknown", "ka")
    b = await _produce(ns, "unknown", "kb")
    t0 = int(time.time() * 1000)
    assert f"commit {a}: done, now committed (operator alice)" in cli_ok(
        await run_cli("txn", "commit", a, "--operator", "alice", *ns))
    assert "done, now rolled back" in cli_ok(await run_cli("txn", "rollback", b, "--operator", "bob", *ns))
    t1 = int(time.time() * 1000)
    ops = broker.store.max_offset(OP_HALF_TOPIC, 0)

    # the same decision again: success, nothing written
    assert f"commit {a}: already committed, nothing changed" in cli_ok(
        await run_cli("txn", "commit", a, "--operator", "alice", *ns))
    assert f"rollback {b}: already rolled back, nothing changed" in cli_ok(
        await run_cli("txn", "rollback", b, *ns))
    # a contradicting one: refused, one line, exit 1
    for args, text in ((("rollback", a), f"transaction {a} is already committed; rollback refused"),
                       (("commit", b), f"transaction {b} is already rolled back; commit refused"),
                       (("resume", a), f"transaction {a} is already committed; resume refused")):
        err = _refusal(await run_cli("txn", *args, "--operator", "eve", *ns))
        assert err == f"{args[0]} transaction {args[1]} at {broker.broker_addr}: TRANSACTION_FAILED (4): {text}", err
    async with AdminClient(namesrv) as admin:
        with pytest.raises(BrokerError) as refused:
            await admin.txn_decide(a, "rollback", "eve")
        assert refused.value.code == ResponseCode.TRANSACTION_FAILED
        assert (await admin.txn_decide(b, "rollback", "bob"))["outcome"] == "duplicate"
        shown = await admin.txn_show(a)
    assert broker.store.max_offset(OP_HALF_TOPIC, 0) == ops
    assert sum(len(broker.store.get("THist", q, 0, 10).raw) for q in range(4)) == 1  # one commit

    # show answers for decided ids with who and when
    assert (shown["state"], shown["source"], shown["operator"], shown["keys"]) == ("committed", "operator", "alice", "ka")
    assert shown["prepared_at"] <= t0 <= shown["decided_at"] <= t1
    doc = await _show(ns, b)
    assert (doc["state"], doc["source"], doc["operator"]) == ("rolled_back", "operator", "bob")
    out = cli_ok(await run_cli("txn", "show", a, *ns))
    assert _line(out, "transaction") == a and _line(out, "state") == "committed"
    assert _line(out, "decided by") == "operator alice" and _line(out, "topic").startswith("THist")
    assert "s after prepare" in _line(out, "decided at")
    assert _line(cli_ok(await run_cli("txn", "show", b, *ns)), "state") == "rolled back"


async def test_unknown_id_is_one_line_naming_the_broker(broker, namesrv) -> None:
    for args in (("show", "NOPE"), ("commit", "NOPE", "--operator", "x"), ("rollback", "NOPE")):
        err = _refusal(await run_cli("txn", *args, "--namesrv", namesrv))
        assert err == f"txn {args[0]} at {broker.broker_addr}: no transaction NOPE", err
    async with AdminClient(namesrv) as admin:
        with pytest.raises(TransactionNotFoundError):
            await admin.txn_show("NOPE")


async def test_show_after_producer_check_back_and_discard(broker, namesrv) -> None:
    ns = ("--namesrv", namesrv)
    committed = await _produce(ns, "commit", "kc")
    rolled = await _produce(ns, "rollback", "kr")
    for txn_id, state in ((committed, "committed"), (rolled, "rolled_back")):
        doc = await _show(ns, txn_id)
        assert (doc["state"], doc["source"], doc["operator"]) == (state, "producer", None)
        assert doc["prepared_at"] <= doc["decided_at"]
    assert _line(cli_ok(await run_cli("txn", "show", committed, *ns)), "decided by") == "producer (END_TRANSACTION)"

    async with TransactionProducer("PG_HIST", namesrv, listener=ByBody()) as producer:
        checked = (await producer.send_message_in_transaction(Message("THist", b"check"))).transaction_id
        hanging = (await producer.send_message_in_transaction(Message("THist", b"hang"))).transaction_id
        async with AdminClient(namesrv) as admin:
            async def discarded() -> bool:
                return (await admin.txn_show(hanging))["state"] == "discarded"

            await eventually(discarded, 15, "the hanging half discarded")
            doc = await admin.txn_show(checked)
            # committed by the answer to the first check-back
            assert (doc["state"], doc["source"], doc["checks"]) == ("committed", "check", 1)
            # a check-back waits out the transaction timeout (0.5 s) before it is sent
            assert doc["decided_at"] - doc["prepared_at"] >= 500
            discarded = await admin.txn_show(hanging)
    assert (discarded["source"], discarded["operator"], discarded["checks"]) == ("check", None, 2)
    assert discarded["decided_at"] - discarded["prepared_at"] >= 500
    out = cli_ok(await run_cli("txn", "show", checked, *ns))
    assert _line(out, "decided by") == "producer's answer to a check-back"
    assert _line(out, "checks") == "1"
    out = cli_ok(await run_cli("txn", "show", hanging, *ns))
    assert (_line(out, "state"), _line(out, "decided by")) == (
        "discarded", "check service (no answer after 2 checks)")
    # an operator may still decide a half the check service gave up on; the history follows
    cli_ok(await run_cli("txn", "commit", hanging, "--operator", "ops", *ns))
    doc = await _show(ns, hanging)
    assert (doc["state"], doc["source"], doc["operator"], doc["checks"]) == (
        "committed", "operator", "ops", 2)
    assert doc["decided_at"] >= discarded["decided_at"]
    await eventually(lambda: broker.tx.pending_count() == broker.tx.discarded_count() == 0,
                     msg="nothing left open")


async def test_history_survives_clean_restart_and_sigkill(broker_process) -> None:
    proc = broker_process()
    ns = ("--namesrv", proc.namesrv_addr)
    ids = [await _produce(ns, "commit", "k1"), await _produce(ns, "rollback", "k2"),
           await _produce(ns, "unknown", "k3")]
    cli_ok(await run_cli("txn", "commit", ids[2], "--operator", "alice", *ns))
    before = {i: {k: (await _show(ns, i)).get(k) for k in DECISION_FIELDS} for i in ids}
    assert [before[i]["source"] for i in ids] == ["producer", "producer", "operator"]

    for restart in (proc.restart, lambda: (proc.kill(), proc.start())):
        restart()
        ns = ("--namesrv", proc.namesrv_addr)
        after = {i: {k: (await _show(ns, i)).get(k) for k in DECISION_FIELDS} for i in ids}
        assert after == before
        assert "already committed" in cli_ok(await run_cli("txn", "commit", ids[2], "--operator", "bob", *ns))
        err = _refusal(await run_cli("txn", "commit", ids[1], "--operator", "bob", *ns))
        assert "is already rolled back; commit refused" in err
    assert "snapshot + tail" in proc.log_tail() and "full replay" in proc.log_tail()
