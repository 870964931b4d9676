"""The client commands through click's runner against a live in-process broker
(support.cli_runner runs them in a worker thread, so the broker keeps serving)."""

from __future__ import annotations

import asyncio
import socket

import orjson
import pytest
from support.cli_runner import cli_ok, cli_one_line_error, run_cli
from support.waiting import eventually

from txbroker.cli.status import KEY_METRICS, masterless
from txbroker.remoting.codes import RequestCode, ResponseCode
from txbroker.remoting.command import RemotingCommand


async def test_topic_produce_consume(broker, namesrv, tmp_path) -> None:
    ns = ("--namesrv", namesrv)
    assert "created with 2 queue(s)" in cli_ok(await run_cli("topic", "create", "TCli", "--queues", "2", *ns))
    table = cli_ok(await run_cli("topic", "list", *ns))
    assert "TCli" in table and "RMQ_SYS_TRANS_HALF_TOPIC" not in table
    assert "RMQ_SYS_TRANS_HALF_TOPIC" in cli_ok(await run_cli("topic", "list", "--system", *ns))
    listed = orjson.loads(cli_ok(await run_cli("topic", "list", "--json", *ns)))
    assert listed["TCli"]["writeQueueNums"] == 2

    out = cli_ok(await run_cli("produce", "--topic", "TCli", "--body", "hello", "--keys", "K1",
                         "--tags", "TagA", "--count", "2", "--property", "color=red", "--json", *ns))
    sent = [orjson.loads(line) for line in out.splitlines()]
    assert len(sent) == 2 and all(s["status"] == "SEND_OK" and len(s["msg_id"]) == 32 for s in sent)
    body_file = tmp_path / "body.bin"
    body_file.write_bytes(b"\x00\xffbinary")
    cli_ok(await run_cli("produce", "--topic", "TCli", "--file", str(body_file), *ns))
    # the environment variable stands in for --namesrv
    cli_ok(await run_cli("produce", "--topic", "TCli", "--file", "-", env={"TXBROKER_NAMESRV": namesrv},
                   input=b"from stdin"))

    out = cli_ok(await run_cli("consume", "--topic", "TCli", "--group", "CG_CLI", "--from-beginning",
                         "--max", "4", "--json", "--timeout", "10", *ns))
    got = [orjson.loads(line) for line in out.splitlines()]
    assert sorted(g.get("body", "") for g in got) == ["", "from stdin", "hello", "hello"]
    hello = next(g for g in got if g.get("body") == "hello")
    assert hello["tags"] == "TagA" and hello["keys"] == "K1" and hello["properties"]["color"] == "red"
    assert any(g.get("body_base64") for g in got)
    # offsets were committed: the group has nothing left
    out = cli_ok(await run_cli("consume", "--topic", "TCli", "--group", "CG_CLI", "--timeout", "0.5", *ns))
    assert out == ""
    # a new group without --from-beginning only sees new messages
    out = cli_ok(await run_cli("consume", "--topic", "TCli", "--group", "CG_NEW", "--timeout", "0.5", *ns))
    assert out == ""
    # deleted: gone from the list, its queues and committed offsets with it
    assert "topic TCli deleted" in cli_ok(await run_cli("topic", "delete", "TCli", *ns))
    assert "TCli" not in orjson.loads(cli_ok(await run_cli("topic", "list", "--json", *ns)))
    assert broker.store.max_offset("TCli", 0) == 0 and "CG_CLI" not in broker.store.offsets.groups()
    err = cli_one_line_error(await run_cli("topic", "delete", "RMQ_SYS_TRANS_HALF_TOPIC", *ns))
    assert "NO_PERMISSION" in err or "system topic" in err, err


async def test_transactions_and_operator_decisions(broker, namesrv) -> None:
    ns = ("--namesrv", namesrv)
    for decision in ("commit", "rollback", "unknown"):
        out = cli_ok(await run_cli("produce", "--topic", "TCliTx", "--body", decision, "--keys", decision,
                             "--transactional", "--decision", decision, "--json", *ns))
        doc = orjson.loads(out)
        assert doc["local_transaction_state"] == {"commit": "COMMIT_MESSAGE", "rollback": "ROLLBACK_MESSAGE",
                                                  "unknown": "UNKNOW"}[decision]
        if decision == "unknown":
            pending_id, offset_msg_id = doc["transaction_id"], doc["offset_msg_id"]
    await eventually(lambda: broker.tx.pending_count() == 1, msg="one pending half")
    rows = orjson.loads(cli_ok(await run_cli("txn", "list", "--json", *ns)))
    assert any(pending_id in orjson.dumps(r).decode() for r in rows)
    table = cli_ok(await run_cli("txn", "list", *ns))
    assert "TCliTx" in table and "1 pending" in table
    shown = orjson.loads(cli_ok(await run_cli("txn", "show", pending_id, "--json", *ns)))
    assert pending_id in orjson.dumps(shown).decode()
    out = cli_ok(await run_cli("txn", "commit", pending_id, "--operator", "alice", *ns))
    assert f"commit {pending_id}" in out and "alice" in out
    await eventually(lambda: broker.tx.pending_count() == 0, msg="operator commit applied")
    out = cli_ok(await run_cli("consume", "--topic", "TCliTx", "--group", "CG_CLITX", "--from-beginning",
                         "--max", "2", "--timeout", "10", *ns))
    assert sorted(line.rsplit(" ", 1)[-1] for line in out.splitlines()) == ["commit", "unknown"]
    # a contradicting decision is refused, by UNIQ_KEY or by offsetMsgId
    for txn_id in (pending_id, offset_msg_id):
        refused = await run_cli("txn", "rollback", txn_id, "--operator", "bob", *ns)
        line = (f"error: rollback transaction {txn_id} at {broker.broker_addr}: TRANSACTION_FAILED (4): "
                f"transaction {txn_id} is already committed; rollback refused\n")
        assert (refused.exit_code, refused.stderr) == (1, line)
    out = cli_ok(await run_cli("txn", "commit", offset_msg_id, "--operator", "alice", *ns))
    assert "already committed" in out


async def test_status(broker, namesrv, broker_client) -> None:
    ns = ("--namesrv", namesrv)
    cli_ok(await run_cli("topic", "create", "TStat", "--queues", "3", *ns))
    out = cli_ok(await run_cli("produce", "--topic", "TStat", "--body", "x", "--count", "7", "--json", *ns))
    per_queue = [0, 0, 0]
    for line in out.splitlines():
        per_queue[orjson.loads(line)["queue_id"]] += 1
    assert sum(per_queue) == 7 and all(per_queue)  # round robin reached every queue
    # CG_STAT commits every message through the consumer; CG_PART commits partial offsets
    # with a plain UPDATE_CONSUMER_OFFSET (a group with offsets but no member).
    cli_ok(await run_cli("consume", "--topic", "TStat", "--group", "CG_STAT", "--from-beginning",
                   "--max", "7", "--timeout", "10", *ns))
    await eventually(lambda: [broker.store.offsets.get("CG_STAT", "TStat", q) for q in range(3)] == per_queue,
                     msg="CG_STAT offsets committed")
    for qid, offset in ((0, 1), (2, per_queue[2] - 1)):
        resp = await broker_client.invoke(RemotingCommand.request(RequestCode.UPDATE_CONSUMER_OFFSET, {
            "consumerGroup": "CG_PART", "topic": "TStat", "queueId": str(qid),
            "commitOffset": str(offset)}), 5.0)
        assert resp.code == ResponseCode.SUCCESS, resp.remark
    # one half left undecided: the CLI producer is gone, so it stays pending
    cli_ok(await run_cli("produce", "--topic", "TStat", "--body", "maybe", "--transactional",
                   "--decision", "unknown", *ns))
    await eventually(lambda: broker.tx.pending_count() == 1, msg="one pending half")
    # Three more messages, after CG_STAT's commit: the queues' offsets now run past the
    # group's, and they answer the consume command's long polls, which outlive its connection
    # until a message arrives or their suspend deadline passes.
    max_offsets = list(per_queue)
    out = cli_ok(await run_cli("produce", "--topic", "TStat", "--body", "y", "--count", "3", "--json", *ns))
    for line in out.splitlines():
        max_offsets[orjson.loads(line)["queue_id"]] += 1
    await eventually(lambda: broker.holds.held() == 0, msg="held pulls of the gone consumer answered")

    out = cli_ok(await run_cli("status", *ns))
    lines = out.splitlines()
    assert "pending half messages: 1" in lines[0] and broker.broker_addr in lines[0]
    assert "flush=async" in lines[0]
    [topic_row] = [line for line in lines if line.strip("│ ").startswith("TStat ")]
    cells = [c.strip() for c in topic_row.strip("│").split("│")]
    assert cells == ["TStat", "3", "10", " ".join(f"{q}:0..{n}" for q, n in enumerate(max_offsets))]
    [full] = [line for line in lines if "CG_STAT" in line]
    cells = [c.strip() for c in full.strip("│").split("│")]
    assert cells == ["CG_STAT", "0", "TStat " + " ".join(f"{q}:{n}" for q, n in enumerate(per_queue))]
    [part] = [line for line in lines if "CG_PART" in line]
    cells = [c.strip() for c in part.strip("│").split("│")]
    assert cells == ["CG_PART", "0", f"TStat 0:1 2:{per_queue[2] - 1}"]
    [metrics] = [line for line in lines if line.startswith("metrics: ")]
    shown = dict(item.split("=", 1) for item in metrics.removeprefix("metrics: ").split())
    assert list(shown) == list(KEY_METRICS)
    assert shown["commitLogMaxOffset"] == str(broker.store.max_physical_offset)
    assert int(shown["commitLogMaxOffset"]) > 0
    assert shown["pendingHalfMessages"] == "1" and shown["flushMode"] == "async"
    assert shown["brokerVersionDesc"] == "V4_9_8"
    assert int(shown["connections"]) >= 2  # this test's own client and the status command's
    assert shown["heldPulls"] == "0"

    docs = orjson.loads(cli_ok(await run_cli("status", "--json", *ns)))
    [doc] = docs.values()
    assert doc["address"] == broker.broker_addr and doc["pendingHalfMessages"] == 1
    assert doc["topics"]["TStat"]["queues"] == [
        {"queueId": q, "minOffset": 0, "maxOffset": n} for q, n in enumerate(max_offsets)]
    groups = doc["consumerGroups"]
    assert groups["CG_STAT"] == {"consumers": [],
                                 "offsets": {"TStat": {str(q): n for q, n in enumerate(per_queue)}}}
    assert groups["CG_PART"]["offsets"] == {"TStat": {"0": 1, "2": per_queue[2] - 1}}
    assert doc["metrics"]["commitLogMaxOffset"] == str(broker.store.max_physical_offset)
    assert doc["metrics"]["pendingHalfMessages"] == "1"
    # system topics only with --system
    assert "RMQ_SYS_TRANS_HALF_TOPIC" not in out
    assert "RMQ_SYS_TRANS_HALF_TOPIC" in cli_ok(await run_cli("status", "--system", *ns))


async def test_errors_are_one_line(broker, namesrv) -> None:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    dead = f"127.0.0.1:{s.getsockname()[1]}"
    s.close()
    for args in (("status",), ("topic", "list"), ("txn", "list"),
                 ("produce", "--topic", "T", "--body", "x"),
                 ("consume", "--topic", "T", "--group", "G", "--max", "1")):
        err = cli_one_line_error(await run_cli(*args, "--namesrv", dead))
        assert f" at {dead}: connection refused: no broker is running there" in err, err
    err = cli_one_line_error(await run_cli("produce", "--topic", "bad topic", "--body", "x", "--namesrv", namesrv))
    assert "topic" in err
    unknown = await run_cli("txn", "show", "F" * 32, "--namesrv", namesrv)
    assert (unknown.exit_code, unknown.stderr) == (1, f"error: txn show at {broker.broker_addr}: no transaction {'F' * 32}\n")
    usage = await run_cli("produce", "--topic", "T", "--namesrv", namesrv)
    assert usage.exit_code == 2 and "--body or --file" in usage.stderr
    bad_ns = await run_cli("status", "--namesrv", "nonsense")
    assert bad_ns.exit_code == 1 and "host:port" in bad_ns.stderr


async def test_consume_stops_cleanly_on_sigterm(broker, namesrv) -> None:
    import signal
    import sys

    cli_ok(await run_cli("produce", "--topic", "TTerm", "--body", "first", "--namesrv", namesrv))
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-P", "-m", "txbroker", "consume", "--topic", "TTerm",
        "--group", "CG_TERM", "--from-beginning", "--namesrv", namesrv,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    try:
        line = await asyncio.wait_for(proc.stdout.readline(), 20)
        assert line.decode().rstrip().endswith("first")
        # no wait for poll(): the clean stop acknowledges the printed message either way
        proc.send_signal(signal.SIGTERM)
        _, err = await asyncio.wait_for(proc.communicate(), 20)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert proc.returncode == 128 + signal.SIGTERM and b"Traceback" not in err
    # the clean stop committed past the printed message and left the group
    assert sum(broker.store.offsets.get("CG_TERM", "TTerm", q) or 0 for q in range(4)) == 1
    assert broker.registry.consumer_ids("CG_TERM") == []


def _error_text(result) -> str:
    """The message of a one-line CLI error, without its ``error:`` prefix (the checks below
    look for the parts that matter, whatever the command puts around them)."""
    prefix, _, text = cli_one_line_error(result).partition(": ")
    assert prefix.lower() == "error", prefix
    return text


@pytest.mark.slow  # waits for the pulls to be refused: about 5 s
async def test_consume_of_a_topic_deleted_meanwhile_is_one_error_line(broker, namesrv) -> None:
    """The broker refuses every pull TOPIC_NOT_EXIST (the topic was deleted while consumed):
    ``consume`` ends with the broker's answer, not with "consumed 0 messages" and status 0
    once its idle time has passed."""
    ns = ("--namesrv", namesrv)
    cli_ok(await run_cli("topic", "create", "TGone", "--queues", "1", *ns))
    started = asyncio.get_running_loop().time()
    consume = asyncio.create_task(run_cli("consume", "--topic", "TGone", "--group", "CG_GONE",
                                          "--max", "1", "--idle-timeout", "25", *ns))
    await eventually(lambda: "CG_GONE" in broker.registry.consumer_groups(), timeout=10,
                     msg="the consumer joined")
    assert await broker.topics.delete("TGone")
    result = await asyncio.wait_for(consume, 40)
    assert asyncio.get_running_loop().time() - started < 25  # refused, not idle
    what, _, why = _error_text(result).partition(f" at {broker.broker_addr}: ")
    assert what == "pull topic 'TGone' queue 0 as group 'CG_GONE'", what
    assert why.startswith("TOPIC_NOT_EXIST (17): topic[TGone] not exist"), why
    assert "consumed" not in result.output


async def test_consume_of_a_missing_topic_fails_and_creates_nothing(broker, namesrv) -> None:
    ns = ("--namesrv", namesrv)
    result = await run_cli("consume", "--topic", "NoSuch", "--group", "CG_TYPO", "--timeout", "1", *ns)
    assert _error_text(result) == f"consume at {namesrv}: no such topic 'NoSuch'"
    listed = orjson.loads(cli_ok(await run_cli("topic", "list", "--system", "--json", *ns)))
    assert "NoSuch" not in listed and "%RETRY%CG_TYPO" not in listed


async def test_topic_create_existing_and_update(broker, namesrv) -> None:
    ns = ("--namesrv", namesrv)
    addr = broker.broker_addr
    cli_ok(await run_cli("topic", "create", "Keep", "--queues", "4", *ns))
    cli_ok(await run_cli("produce", "--topic", "Keep", "--body", "x", "--count", "12", *ns))
    held = {q: broker.store.max_offset("Keep", q) for q in (1, 2, 3)}
    assert sum(held.values()) > 0

    # create of an existing topic: refused, nothing changes
    result = await run_cli("topic", "create", "Keep", "--queues", "1", *ns)
    text = _error_text(result)
    assert text == f"topic create at {addr}: topic 'Keep' already exists (4 queues); use 'txbroker topic update'"
    assert broker.topics.get("Keep").read_queue_nums == 4

    # a shrink that would hide messages needs --force
    result = await run_cli("topic", "update", "Keep", "--queues", "1", *ns)
    with_data = [q for q, n in held.items() if n]
    queues = "1-3" if with_data == [1, 2, 3] else ", ".join(map(str, with_data))
    text = _error_text(result)
    assert text == (f"topic update at {addr}: queue(s) {queues} of topic 'Keep' hold {sum(held.values())} "
                    "message(s) that shrinking to 1 queue(s) would hide; use --force to shrink anyway"), text
    assert broker.topics.get("Keep").read_queue_nums == 4

    # growing, and changing the permission, need no force
    assert "6 queue(s), perm rw" in cli_ok(await run_cli("topic", "update", "Keep", "--queues", "6", *ns))
    assert "6 queue(s), perm r-" in cli_ok(await run_cli("topic", "update", "Keep", "--perm", "r-", *ns))
    tc = broker.topics.get("Keep")
    assert (tc.read_queue_nums, tc.write_queue_nums, tc.perm) == (6, 6, 4)
    assert "1 queue(s), perm r-" in cli_ok(await run_cli("topic", "update", "Keep", "--queues", "1",
                                                   "--force", *ns))
    assert broker.topics.get("Keep").read_queue_nums == 1

    result = await run_cli("topic", "update", "Nope", "--queues", "2", *ns)
    assert _error_text(result) == f"topic update at {addr}: no such topic 'Nope'"
    assert broker.topics.get("Nope") is None
    result = await run_cli("topic", "update", "Keep", *ns)
    assert result.exit_code == 2 and "nothing to change" in result.stderr


async def test_topic_list_shows_perm_letters(broker, namesrv) -> None:
    ns = ("--namesrv", namesrv)
    for name, perm in (("PermRW", None), ("PermR", "r-"), ("PermW", "-w")):
        cli_ok(await run_cli("topic", "create", name, "--queues", "2", *ns))
        if perm:
            cli_ok(await run_cli("topic", "update", name, "--perm", perm, *ns))
    rows = {line.split("│")[1].strip(): line.split("│")[4].strip()
            for line in cli_ok(await run_cli("topic", "list", *ns)).splitlines()
            if line.count("│") == 5 and "Perm" in line}
    assert rows == {"PermRW": "rw", "PermR": "r-", "PermW": "-w"}


async def test_group_name_errors_name_the_group(broker, namesrv) -> None:
    ns = ("--namesrv", namesrv)
    result = await run_cli("consume", "--topic", "T", "--group", "bad group", "--timeout", "1", *ns)
    text = _error_text(result)
    assert "consumer group 'bad group' may only contain" in text and "topic 'bad" not in text, text
    result = await run_cli("produce", "--topic", "T", "--body", "x", "--group", "bad group", *ns)
    text = _error_text(result)
    assert "producer group 'bad group' may only contain" in text and "topic 'bad" not in text, text


def test_masterless_names_replicated_groups_without_a_master() -> None:
    """What ``status --wait`` waits on: a group whose members report replication and none of
    which says it is master (a failover in progress); single brokers and down or unreachable
    members (no replication document) never make a group wait."""
    repl = {"inSync": True}
    docs = [
        {"brokerName": "broker-a", "role": "slave", "replication": repl},
        {"brokerName": "broker-a", "role": "down"},
        {"brokerName": "broker-b", "role": "master", "replication": repl},
        {"brokerName": "broker-b", "role": "slave", "replication": repl},
        {"brokerName": "broker-c", "role": "master", "error": "connection refused"},
        {"brokerName": "single", "role": "master"},
    ]
    assert masterless(docs) == ["broker-a"]
    docs[0]["role"] = "master"
    assert masterless(docs) == []
