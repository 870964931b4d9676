"""A hostile Kafka client for the group-pruning test: it creates many groups and walks away.

``commits`` OffsetCommit v2 requests, each for a new group (``<prefix>-c-<n>``, generation -1:
a "simple" group known only by its offset), and ``joins`` JoinGroup v5 requests with no member
id, each for a new group (``<prefix>-j-<n>``): the broker answers MEMBER_ID_REQUIRED and holds
the id for the session timeout, and the client never comes back with it.  Requests are
pipelined on one connection, ``window`` at a time, through txbroker's own sans-IO Kafka codec.
Returns the error codes answered, counted.

Run: python tests/support/kafka_group_flood.py HOST:PORT TOPIC [--commits N] [--joins N]
"""

from __future__ import annotations

import argparse
import asyncio
import json
from collections import Counter

from txbroker.remoting.kafka.apis import ApiKey
from txbroker.remoting.kafka.framing import (
    FrameSplitter,
    decode_response,
    encode_request,
)

MAX_FRAME = 1 << 20


def _requests(topic: str, prefix: str, commits: int, joins: int, session_ms: int):
    for n in range(commits):
        yield ApiKey.OFFSET_COMMIT, 2, {
            "group_id": f"{prefix}-c-{n}", "generation_id_or_member_epoch": -1, "member_id": "",
            "retention_time_ms": -1,
            "topics": [{"name": topic, "partitions": [
                {"partition_index": 0, "committed_offset": 0, "committed_metadata": "hostile"}]}]}
    for n in range(joins):
        yield ApiKey.JOIN_GROUP, 5, {
            "group_id": f"{prefix}-j-{n}", "session_timeout_ms": session_ms,
            "rebalance_timeout_ms": session_ms, "member_id": "", "group_instance_id": None,
            "protocol_type": "consumer", "protocols": [{"name": "range", "metadata": b"m"}]}


def _codes(api_key: int, body: dict) -> list[int]:
    if api_key == ApiKey.OFFSET_COMMIT:
        return [p["error_code"] for t in body["topics"] for p in t["partitions"]]
    return [body["error_code"]]


async def flood(addr: str, topic: str, *, prefix: str = "flood", commits: int = 10_000,
                joins: int = 10_000, session_ms: int = 1000, window: int = 32) -> Counter:
    host, port = addr.rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port))
    splitter = FrameSplitter(MAX_FRAME)
    answered: Counter = Counter()
    in_flight: dict[int, int] = {}
    ready: list[bytes] = []

    async def one_answer() -> None:
        while not ready:
            data = await asyncio.wait_for(reader.read(65536), 30)
            if not data:
                raise ConnectionError("the broker closed the connection")
            ready.extend(splitter.feed(data))
        frame = ready.pop(0)
        cid = int.from_bytes(frame[:4], "big")
        api_key = in_flight.pop(cid)
        version = 2 if api_key == ApiKey.OFFSET_COMMIT else 5
        _, body = decode_response(api_key, version, frame)
        answered.update(_codes(api_key, body))

    try:
        for cid, (api_key, version, body) in enumerate(
                _requests(topic, prefix, commits, joins, session_ms)):
            while len(in_flight) >= window:
                await one_answer()
            in_flight[cid] = api_key
            writer.write(encode_request(api_key, version, cid, "flood", body))
            if cid % window == 0:
                await writer.drain()
        await writer.drain()
        while in_flight:
            await one_answer()
    finally:
        writer.close()
    return answered


async def ask(addr: str, api_key: int, version: int, body: dict, timeout: float = 10.0) -> dict:
    """One request on a new connection; its answer's body (within ``timeout`` seconds)."""
    host, port = addr.rsplit(":", 1)
    reader, writer = await asyncio.wait_for(asyncio.open_connection(host, int(port)), timeout)
    try:
        writer.write(encode_request(api_key, version, 1, "probe", body))
        size = int.from_bytes(await asyncio.wait_for(reader.readexactly(4), timeout), "big")
        frame = await asyncio.wait_for(reader.readexactly(size), timeout)
        return decode_response(api_key, version, frame)[1]
    finally:
        writer.close()


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("addr")
    ap.add_argument("topic")
    ap.add_argument("--commits", type=int, default=10_000)
    ap.add_argument("--joins", type=int, default=10_000)
    args = ap.parse_args()
    got = asyncio.run(flood(args.addr, args.topic, commits=args.commits, joins=args.joins))
    print(json.dumps({int(k): v for k, v in got.items()}))
