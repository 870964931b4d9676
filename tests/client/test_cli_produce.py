"""``txbroker produce`` against real brokers: what its summary and per-message lines say about
messages stored without the full promise, which group each message went to, topics its sends
create, and a run stopped by Ctrl-C."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import sys
from pathlib import Path

import orjson
import pytest
from support.cli_runner import cli_ok, cli_one_line_error, default_sigint, run_cli
from support.cluster import InProcessCluster
from support.waiting import eventually

from txbroker.broker import Broker
from txbroker.config import BrokerConfig


def _stored(broker: Broker, topic: str) -> int:
    return sum(broker.store.max_offset(topic, q) for q in range(8))


async def test_summary_counts_sends_stored_without_a_slave_apart(
        broker_config: BrokerConfig, tmp_path: Path) -> None:
    # A SYNC_MASTER alone in its group (as after a failover) stores every send and answers
    # SLAVE_NOT_AVAILABLE: the message is on the master only.
    async with InProcessCluster(broker_config, tmp_path) as c:
        await c.namesrv()
        master = await c.broker("broker-a", broker_role="SYNC_MASTER")
        ns = ("--namesrv", c.namesrv_addr)
        result = await run_cli("produce", "--topic", "TNoSlave", "--body", "x", "--count", "4", *ns)
        assert result.exit_code == 0, result.output
        summary = result.stderr.splitlines()[-1]
        assert summary.startswith("sent 4 (4 not yet replicated), failed 0 in "), summary
        assert _stored(master, "TNoSlave") == 4

        result = await run_cli("produce", "--topic", "TNoSlave", "--body", "x", "--count", "2",
                               "--json", *ns)
        docs = [orjson.loads(line) for line in cli_ok(result).splitlines()]
        assert [(d["status"], d["caveat"]) for d in docs] == [
            ("SLAVE_NOT_AVAILABLE", "not yet replicated")] * 2
        assert result.stderr.splitlines()[-1].startswith("sent 2 (2 not yet replicated), failed 0 ")

        result = await run_cli("produce", "--topic", "TNoSlave", "--body", "x", "--verbose", *ns)
        [line] = cli_ok(result).splitlines()
        assert line.startswith("status=SLAVE_NOT_AVAILABLE ") and \
            line.endswith(" caveat='not yet replicated'"), line


async def test_lines_name_the_broker_group_each_message_went_to(
        broker_config: BrokerConfig, tmp_path: Path) -> None:
    async with InProcessCluster(broker_config, tmp_path) as c:
        await c.namesrv()
        a = await c.broker("broker-a")
        b = await c.broker("broker-b")
        ns = ("--namesrv", c.namesrv_addr)
        cli_ok(await run_cli("topic", "create", "TGroups", "--cluster", "DefaultCluster", *ns))
        result = await run_cli("produce", "--topic", "TGroups", "--body", "x", "--count", "8",
                               "--json", *ns)
        docs = [orjson.loads(line) for line in cli_ok(result).splitlines()]
        groups = [d["broker"] for d in docs]
        assert set(groups) == {"broker-a", "broker-b"}, groups
        # Each line names the group that stored it.
        assert _stored(a, "TGroups") == groups.count("broker-a")
        assert _stored(b, "TGroups") == groups.count("broker-b")

        result = await run_cli("produce", "--topic", "TGroups", "--body", "x", "--count", "2",
                               "--verbose", *ns)
        for line in cli_ok(result).splitlines():
            assert re.search(r" broker=broker-[ab] ", line), line


async def test_a_send_that_creates_its_topic_says_so(broker, namesrv, caplog) -> None:
    ns = ("--namesrv", namesrv)
    caplog.set_level("INFO", logger="txbroker.service.topics")
    result = await run_cli("produce", "--topic", "Ordres", "--body", "x", *ns)
    assert result.exit_code == 0, result.output
    assert result.stderr.splitlines()[0] == "created topic 'Ordres'", result.stderr
    assert any("created topic 'Ordres'" in r.getMessage() and r.levelname == "INFO"
               for r in caplog.records), caplog.text
    # Once it exists, nothing more is said.
    result = await run_cli("produce", "--topic", "Ordres", "--body", "x", *ns)
    assert "created" not in result.stderr and result.stderr.startswith("sent 1, failed 0 ")


async def test_no_create_refuses_an_unknown_topic(broker, namesrv) -> None:
    result = await run_cli("produce", "--topic", "Ordres", "--body", "x", "--count", "3",
                           "--no-create", "--namesrv", namesrv)
    err = cli_one_line_error(result)
    assert err == (f"error: send to topic 'Ordres' at {namesrv}: no such topic 'Ordres' "
                   "(--no-create); create it with 'txbroker topic create Ordres'"), err
    assert "Ordres" not in broker.topics.names()
    # An existing topic is fine with --no-create.
    cli_ok(await run_cli("topic", "create", "Orders", "--namesrv", namesrv))
    result = await run_cli("produce", "--topic", "Orders", "--body", "x", "--no-create",
                           "--namesrv", namesrv)
    assert result.exit_code == 0 and result.stderr.startswith("sent 1, failed 0 "), result.output


async def test_sdk_producer_without_create_topics_raises_topic_not_found(broker, namesrv) -> None:
    from txbroker.client import Message, Producer
    from txbroker.client.errors import TopicNotFoundError

    async with Producer("PG_NOCREATE", namesrv, create_topics=False) as producer:
        with pytest.raises(TopicNotFoundError, match=f"^no such topic 'Ordres' at {namesrv}$"):
            await producer.send(Message("Ordres", b"x"))
        assert producer.created_topics == set()
    assert "Ordres" not in broker.topics.names()
    async with Producer("PG_CREATE", namesrv) as producer:
        await producer.send(Message("Ordres", b"x"))
        assert producer.created_topics == {"Ordres"}


INTERRUPTED = re.compile(r"^interrupted: sent (?P<sent>[\d,]+), failed 0"
                         r"(?:, (?P<doubt>\d+) in doubt \(in flight: stored or not\))? in ")


async def test_ctrl_c_reports_acknowledged_and_in_doubt_sends(broker, namesrv) -> None:
    cli_ok(await run_cli("topic", "create", "TCtrlC", "--namesrv", namesrv))
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-P", "-m", "txbroker", "produce", "--topic", "TCtrlC", "--body", "x",
        "--count", "1000000", "--namesrv", namesrv,
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE,
        env={**os.environ, "PYTHONUNBUFFERED": "1"}, preexec_fn=default_sigint)
    try:
        await eventually(lambda: _stored(broker, "TCtrlC") >= 200, timeout=60,
                         msg="the producer is sending")
        proc.send_signal(signal.SIGINT)
        _out, err = await asyncio.wait_for(proc.communicate(), 60)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert proc.returncode == 130, (proc.returncode, err)
    lines = err.decode().splitlines()
    assert len(lines) == 1 and "Traceback" not in err.decode(), lines
    m = INTERRUPTED.match(lines[0])
    assert m, lines[0]
    sent, doubt = int(m["sent"].replace(",", "")), int(m["doubt"] or 0)
    assert doubt <= 1
    # Everything reported sent is stored; at most the send in doubt is stored besides.
    await eventually(lambda: _stored(broker, "TCtrlC") >= sent, timeout=10,
                     msg=f"{sent} acknowledged sends stored")
    assert sent <= _stored(broker, "TCtrlC") <= sent + doubt, (sent, doubt, _stored(broker, "TCtrlC"))
