"""Topics with a ``.`` in their name (``orders.v1``, as Kafka clients name them) through the
``txbroker`` CLI (a subprocess, as a user runs it) and the SDK, against ``txbroker serve`` in a
subprocess: the SDK and CLI take every name the broker takes, and refuse, in one ``error:``
line, the names it refuses."""

from __future__ import annotations

import asyncio
import subprocess
import sys

import orjson
import pytest
from kafka.admin import KafkaAdminClient, NewTopic
from support.consuming import collect

from txbroker.client import Consumer, Message, Producer
from txbroker.client.message import validate_topic
from txbroker.store.record import MAX_STORED_TOPIC_BYTES

TIMEOUT = 30.0
FAST = {"long_poll_timeout": 1.0, "rebalance_interval": 0.5, "persist_interval": 0.2}


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    """``txbroker ARGS`` in its own process, bounded in time."""
    return subprocess.run([sys.executable, "-P", "-m", "txbroker", *args], capture_output=True,
                          text=True, timeout=TIMEOUT, check=False)


def cli_ok(*args: str) -> str:
    proc = cli(*args)
    assert proc.returncode == 0, (args, proc.returncode, proc.stdout, proc.stderr)
    return proc.stdout


def listed(namesrv: str) -> set[str]:
    return set(orjson.loads(cli_ok("topic", "list", "--json", "--namesrv", namesrv)))


def _kafka_create(bootstrap: str, topic: str) -> None:
    admin = KafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=20000)
    try:
        admin.create_topics([NewTopic(topic, num_partitions=2, replication_factor=1)])
    finally:
        admin.close()


async def _cli(*args: str) -> str:
    """The CLI from a test's event loop: the SDK clients beside it keep running meanwhile."""
    return await asyncio.to_thread(cli_ok, *args)


async def _produce_and_consume(namesrv: str, topic: str) -> None:
    ns = ("--namesrv", namesrv)
    out = await _cli("produce", "--topic", topic, "--body", "from-cli", "--count", "3", "--json", *ns)
    assert [orjson.loads(line)["status"] for line in out.splitlines()] == ["SEND_OK"] * 3, out

    async with Producer("PG_DOTS", namesrv) as producer:
        for i in range(2):
            result = await producer.send(Message(topic, f"from-sdk-{i}".encode()))
            assert result.send_status.name == "SEND_OK" and result.topic == topic, result

    out = await _cli("consume", "--topic", topic, "--group", "CG_DOTS_CLI", "--from-beginning",
                     "--max", "5", "--idle-timeout", "10", "--json", *ns)
    bodies = sorted(orjson.loads(line)["body"] for line in out.splitlines())
    assert bodies == ["from-cli"] * 3 + ["from-sdk-0", "from-sdk-1"], out

    consumer = Consumer("CG_DOTS_SDK", namesrv, from_where="first", **FAST)
    consumer.subscribe(topic, "*")
    async with consumer:
        got = await collect(consumer, 5)
    assert sorted(m.body for m in got) == [b"from-cli"] * 3 + [b"from-sdk-0", b"from-sdk-1"]
    assert {m.topic for m in got} == {topic}


@pytest.mark.slow  # CLI processes, several seconds
async def test_a_topic_a_kafka_client_made_works_from_the_cli_and_sdk(broker_process) -> None:
    proc = broker_process(kafka_port=0)
    namesrv = proc.namesrv_addr
    await asyncio.wait_for(asyncio.to_thread(_kafka_create, proc.kafka_addr, "orders.v1"), TIMEOUT)
    assert "orders.v1" in await asyncio.to_thread(listed, namesrv)

    await _produce_and_consume(namesrv, "orders.v1")

    out = await _cli("topic", "delete", "orders.v1", "--namesrv", namesrv)
    assert out.strip() == "topic orders.v1 deleted", out
    assert "orders.v1" not in await asyncio.to_thread(listed, namesrv)


@pytest.mark.slow  # CLI processes, several seconds
async def test_a_dotted_topic_the_cli_creates_works_end_to_end(broker_process) -> None:
    proc = broker_process()
    namesrv = proc.namesrv_addr
    await _cli("topic", "create", "billing.events.v2", "--namesrv", namesrv)
    await _produce_and_consume(namesrv, "billing.events.v2")
    await _cli("topic", "delete", "billing.events.v2", "--namesrv", namesrv)
    assert "billing.events.v2" not in await asyncio.to_thread(listed, namesrv)


REFUSED = [
    ("orders/v1", "contains one or more characters other than"),
    ("orders v1", "contains one or more characters other than"),
    ("..", "'..' is not allowed"),
    ("t" * (MAX_STORED_TOPIC_BYTES + 1), f"longer than the max allowed length {MAX_STORED_TOPIC_BYTES}"),
]


@pytest.mark.slow  # CLI processes, several seconds
def test_names_the_broker_refuses_are_refused_in_one_error_line(broker_process) -> None:
    namesrv = broker_process().namesrv_addr
    for name, reason in REFUSED:
        for args in (("produce", "--topic", name, "--body", "x"),
                     ("consume", "--topic", name, "--group", "CG", "--idle-timeout", "1"),
                     ("topic", "create", name),
                     ("topic", "delete", name)):
            proc = cli(*args, "--namesrv", namesrv)
            err = proc.stderr.strip()
            assert proc.returncode == 1, (args, proc.returncode, proc.stdout, proc.stderr)
            assert err.startswith("error: ") and "\n" not in err and reason in err, (args, err)
    assert not {name for name, _ in REFUSED} & listed(namesrv)


def test_the_sdk_takes_every_name_the_broker_takes() -> None:
    for name in ("orders.v1", "a.b-c_d", "%RETRY%g", "x|y", "t" * MAX_STORED_TOPIC_BYTES):
        assert validate_topic(name) == name
    for name in ("", ".", "..", "a/b", "a b", "é", "t" * (MAX_STORED_TOPIC_BYTES + 1)):
        with pytest.raises(ValueError, match="^Topic name is invalid: "):
            validate_topic(name)
