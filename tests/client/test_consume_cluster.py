"""``txbroker consume`` names the broker group each message came from, in text and JSON lines.

Two broker groups (``broker-a``, ``broker-b``) behind a standalone name server, in process on
127.0.0.1 port 0; the command runs through click's runner.
"""

from __future__ import annotations

import orjson
import pytest
from support.cli_runner import cli_ok, run_cli
from support.cluster import InProcessCluster

from txbroker.client import Message, Producer
from txbroker.client.admin import AdminClient

GROUPS = ("broker-a", "broker-b")


@pytest.mark.parametrize("as_json", [False, True], ids=["text", "json"])
async def test_consume_lines_name_the_broker_group(broker_config, tmp_path, as_json) -> None:
    async with InProcessCluster(broker_config, tmp_path) as cluster:
        await cluster.namesrv()
        for name in GROUPS:
            await cluster.broker(name)
        namesrv = cluster.namesrv_addr
        async with AdminClient(namesrv) as admin:
            await admin.create_topic("TWhere", 2, cluster=broker_config.cluster_name)
        sent_to: dict[str, str] = {}  # body -> the group that stored it
        async with Producer("PG_WHERE", namesrv) as producer:
            for i in range(8):
                body = f"m{i}"
                sent_to[body] = (await producer.send(Message("TWhere", body.encode()))).broker_name
        assert set(sent_to.values()) == set(GROUPS)  # the sends reached both groups

        out = cli_ok(await run_cli("consume", "--topic", "TWhere", "--group", "CG_WHERE",
                                   "--from-beginning", "--max", "8", "--timeout", "10",
                                   *(["--json"] if as_json else []), "--namesrv", namesrv))
        shown: dict[str, str] = {}
        for line in out.splitlines():
            if as_json:
                doc = orjson.loads(line)
                shown[doc["body"]] = doc["broker_name"]
            else:
                words = line.split()
                [broker] = [w.removeprefix("broker=") for w in words if w.startswith("broker=")]
                shown[words[-1]] = broker
        assert shown == sent_to
