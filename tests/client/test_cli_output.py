"""What the client commands print: produce's summary, transaction outcomes, consume's end, errors.

Data goes to stdout (messages, per-message lines with --verbose or --json), everything else —
summaries, transaction outcomes, errors — to stderr, one line each, so pipes stay clean.
"""

from __future__ import annotations

import re
import time

import orjson
from support.cli_runner import cli_ok, cli_one_line_error, run_cli

SUMMARY = re.compile(r"^sent (?P<sent>[\d,]+), failed (?P<failed>[\d,]+) in (?P<seconds>[\d.]+) s: "
                     r"(?P<rate>[\d,]+) msgs/s, latency p50 (?P<p50>[\d.]+) ms, p99 (?P<p99>[\d.]+) ms$")


def _summary(stderr: str) -> dict[str, float]:
    [line] = stderr.splitlines()
    m = SUMMARY.match(line)
    assert m, line
    return {k: float(v.replace(",", "")) for k, v in m.groupdict().items()}


async def test_produce_count_prints_one_summary_line(broker, namesrv) -> None:
    ns = ("--namesrv", namesrv)
    result = await run_cli("produce", "--topic", "TSummary", "--body", "x", "--count", "50", *ns)
    assert cli_ok(result) == ""  # no per-message lines
    created, _, rest = result.stderr.partition("\n")
    assert created == "created topic 'TSummary'"  # its first send created it
    s = _summary(rest)
    assert (s["sent"], s["failed"]) == (50, 0) and s["rate"] > 0 and 0 < s["p50"] <= s["p99"]
    assert broker.store.max_offset("TSummary", 0) > 0

    result = await run_cli("produce", "--topic", "TSummary", "--body", "x", "--count", "50", "--json", *ns)
    docs = [orjson.loads(line) for line in cli_ok(result).splitlines()]
    assert len(docs) == 50 and {d["status"] for d in docs} == {"SEND_OK"}
    assert _summary(result.stderr)["sent"] == 50

    result = await run_cli("produce", "--topic", "TSummary", "--body", "x", "--count", "3", "--verbose", *ns)
    lines = cli_ok(result).splitlines()
    assert len(lines) == 3 and all(line.startswith("status=SEND_OK msg_id=") for line in lines)


async def test_produce_failures_exit_1_with_one_error_line(broker, namesrv) -> None:
    # The broker refuses every send to a system topic: nothing is sent, one line says why.
    result = await run_cli("produce", "--topic", "RMQ_SYS_TRANS_HALF_TOPIC", "--body", "x", "--count", "3",
                        "--namesrv", namesrv)
    err = cli_one_line_error(result)
    assert err.startswith(f"error: send to topic 'RMQ_SYS_TRANS_HALF_TOPIC' at {broker.broker_addr}: "
                          "NO_PERMISSION (16): "), err
    assert result.stdout == ""
    result = await run_cli("produce", "--topic", "RMQ_SYS_TRANS_HALF_TOPIC", "--body", "x", "--count", "2",
                        "--json", "--namesrv", namesrv)
    assert result.exit_code == 1
    assert [orjson.loads(line)["status"] for line in result.stdout.splitlines()] == ["FAILED", "FAILED"]


async def test_transactional_produce_says_what_became_of_the_transaction(broker, namesrv) -> None:
    ns = ("--namesrv", namesrv)
    cli_ok(await run_cli("topic", "create", "TTxOut", *ns))  # no "created topic" line below
    outcome = {}
    for decision in ("commit", "rollback", "unknown"):
        result = await run_cli("produce", "--topic", "TTxOut", "--body", decision, "--transactional",
                            "--decision", decision, "--json", *ns)
        txn_id = orjson.loads(cli_ok(result))["transaction_id"]
        summary, outcome[decision] = result.stderr.splitlines()
        assert SUMMARY.match(summary), summary
        assert outcome[decision].startswith(f"transaction {txn_id} "), outcome[decision]
    assert outcome["commit"].endswith("committed: visible to consumers")
    assert outcome["rollback"].endswith("rolled back: never visible to consumers")
    assert ("left unknown: the broker will check back the producer group txbroker-cli-producer; "
            f"decide it now with `txbroker txn commit {txn_id}` or `txbroker txn rollback {txn_id}`"
            in outcome["unknown"])
    # the id given is the one the txn commands take
    assert txn_id in cli_ok(await run_cli("txn", "show", txn_id, *ns))
    # and the rolled-back message never reaches a consumer
    out = cli_ok(await run_cli("consume", "--topic", "TTxOut", "--group", "CG_TXOUT", "--from-beginning",
                         "--max", "3", "--idle-timeout", "1", *ns))
    assert [line.rsplit(" ", 1)[-1] for line in out.splitlines()] == ["commit"]

    result = await run_cli("produce", "--topic", "TTxOut", "--body", "more", "--transactional",
                        "--decision", "rollback", "--count", "2", *ns)
    assert cli_ok(result) == ""
    assert result.stderr.splitlines()[1] == "2 transactions rolled back: never visible to consumers"


async def test_consume_max_ends_when_the_topic_runs_dry(broker, namesrv) -> None:
    ns = ("--namesrv", namesrv)
    cli_ok(await run_cli("produce", "--topic", "TIdle", "--body", "m", "--count", "3", *ns))
    started = time.monotonic()
    result = await run_cli("consume", "--topic", "TIdle", "--group", "CG_IDLE", "--from-beginning",
                        "--max", "10", "--idle-timeout", "0.5", *ns)
    assert time.monotonic() - started < 10
    assert len(cli_ok(result).splitlines()) == 3
    assert result.stderr == ("consumed 3 messages of topic TIdle as group CG_IDLE "
                             "(no new message for 0.5 s)\n")
    # --max without --idle-timeout stops after 5 idle seconds, and says so
    assert "[default: 5 with --max, else follow until Ctrl-C]" in " ".join(
        cli_ok(await run_cli("consume", "--help")).split())


async def test_usage_and_broker_errors_are_one_line(broker, namesrv) -> None:
    for args in (("produce", "--topic", "T"), ("produce", "--topic", "T", "--body", "x", "--count", "0"),
                 ("consume", "--topic", "T"), ("no-such-command",)):
        result = await run_cli(*args)
        assert result.exit_code == 2, result.output
        [line] = result.stderr.splitlines()
        assert line.startswith("error: ") and line.endswith(" --help')"), line
    err = cli_one_line_error(await run_cli("topic", "delete", "RMQ_SYS_TRANS_HALF_TOPIC", "--namesrv", namesrv))
    assert f" at {broker.broker_addr}: NO_PERMISSION (16)" in err, err
    err = cli_one_line_error(await run_cli("produce", "--topic", "T", "--file", "/nonexistent/body",
                                     "--namesrv", namesrv))
    assert err == "error: read the body at /nonexistent/body: No such file or directory"
