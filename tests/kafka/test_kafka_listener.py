"""The Kafka listener on the wire (raw frames through a real socket): ordering, ApiVersions'
unsupported-version answer, what closes a connection, and ``txbroker serve``'s Kafka port."""

from __future__ import annotations

import asyncio
import logging
import socket
import subprocess
import sys
from pathlib import Path

from txbroker.remoting.kafka.apis import ADVERTISED, ApiKey
from txbroker.remoting.kafka.errors import ErrorCode
from txbroker.remoting.kafka.framing import decode_response, encode_request

REPO_ROOT = Path(__file__).resolve().parents[2]
WAIT = 5.0


class Wire:
    """One raw Kafka connection."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    @classmethod
    async def open(cls, port: int) -> Wire:
        return cls(*await asyncio.open_connection("127.0.0.1", port))

    def send(self, key: int, version: int, corr: int, body: dict) -> None:
        self.writer.write(encode_request(key, version, corr, "wire-test", body))

    async def frame(self) -> bytes:
        size = int.from_bytes(await asyncio.wait_for(self.reader.readexactly(4), WAIT), "big")
        return await asyncio.wait_for(self.reader.readexactly(size), WAIT)

    async def call(self, key: int, version: int, corr: int, body: dict) -> dict:
        self.send(key, version, corr, body)
        got_corr, answer = decode_response(key, version, await self.frame())
        assert got_corr == corr
        return answer

    async def closed(self) -> bool:
        return await asyncio.wait_for(self.reader.read(), WAIT) == b""

    def close(self) -> None:
        self.writer.close()


async def test_api_versions_lists_the_advertised_ranges(kafka_broker) -> None:
    wire = await Wire.open(kafka_broker.kafka_port)
    try:
        for version in (0, 1, 2, 3):
            body = ({"client_software_name": "wire-test", "client_software_version": "1.0"}
                    if version == 3 else {})
            answer = await wire.call(ApiKey.API_VERSIONS, version, version + 1, body)
            assert answer["error_code"] == ErrorCode.NONE
            got = {k["api_key"]: (k["min_version"], k["max_version"]) for k in answer["api_keys"]}
            assert got == {int(k): v for k, v in ADVERTISED.items()}
    finally:
        wire.close()


async def test_api_versions_v3_bad_software_name_is_invalid_request(kafka_broker) -> None:
    wire = await Wire.open(kafka_broker.kafka_port)
    try:
        answer = await wire.call(ApiKey.API_VERSIONS, 3, 9, {"client_software_name": "-bad name",
                                                             "client_software_version": "1"})
        assert answer["error_code"] == ErrorCode.INVALID_REQUEST
    finally:
        wire.close()


async def test_api_versions_v4_gets_kafkas_v0_error_and_the_connection_stays(kafka_broker) -> None:
    wire = await Wire.open(kafka_broker.kafka_port)
    try:
        # v4 has v3's layout: a v3 request with the version field rewritten.
        v3 = encode_request(ApiKey.API_VERSIONS, 3, 7, "t", {"client_software_name": "x",
                                                            "client_software_version": "1"})
        wire.writer.write(v3[:6] + (4).to_bytes(2, "big") + v3[8:])
        size = await asyncio.wait_for(wire.reader.readexactly(4), WAIT)
        rest = await asyncio.wait_for(wire.reader.readexactly(16), WAIT)
        assert (size + rest).hex() == "00000010" "00000007" "0023" "00000001" "0012" "0000" "0003"
        # Still open: the client retries with a version we serve.
        answer = await wire.call(ApiKey.API_VERSIONS, 0, 8, {})
        assert answer["error_code"] == ErrorCode.NONE
    finally:
        wire.close()


async def test_produce_v2_closes_the_connection(kafka_broker, caplog) -> None:
    wire = await Wire.open(kafka_broker.kafka_port)
    caplog.set_level(logging.WARNING, "txbroker.kafka")
    try:
        wire.writer.write(_raw_request(ApiKey.PRODUCE, 2, 5))
        assert await wire.closed()
    finally:
        wire.close()
    assert "produce v2 is not served" in caplog.text


async def test_unknown_api_key_closes_the_connection(kafka_broker) -> None:
    wire = await Wire.open(kafka_broker.kafka_port)
    try:
        wire.writer.write(_raw_request(57, 0, 5))
        assert await wire.closed()
    finally:
        wire.close()


async def test_malformed_body_closes_with_one_line_naming_peer_and_api(kafka_broker,
                                                                        caplog) -> None:
    caplog.set_level(logging.WARNING, "txbroker.kafka")
    wire = await Wire.open(kafka_broker.kafka_port)
    try:
        # A Metadata v1 header, then a topic array claiming 5 entries and holding none.
        wire.writer.write(_raw_request(ApiKey.METADATA, 1, 3, b"\x00\x00\x00\x05"))
        assert await wire.closed()
    finally:
        wire.close()
    lines = [r.getMessage() for r in caplog.records if "closing Kafka connection" in r.getMessage()]
    assert len(lines) == 1 and "127.0.0.1:" in lines[0] and "metadata" in lines[0]


async def test_oversize_frame_closes_the_connection(kafka_broker) -> None:
    wire = await Wire.open(kafka_broker.kafka_port)
    try:
        too_big = kafka_broker.config.max_frame_size + 1
        wire.writer.write(too_big.to_bytes(4, "big") + b"\x00" * 64)
        assert await wire.closed()
    finally:
        wire.close()


async def test_pipelined_requests_are_answered_in_order(kafka_broker) -> None:
    wire = await Wire.open(kafka_broker.kafka_port)
    try:
        # A slow one (a long-polling fetch) first, then a fast one: answers keep the order.
        await wire.call(ApiKey.CREATE_TOPICS, 3, 1, {"topics": [_new_topic("Piped", 1)],
                                                     "timeout_ms": 1000, "validate_only": False})
        fetch = {"replica_id": -1, "max_wait_ms": 300, "min_bytes": 1, "max_bytes": 1 << 20,
                 "isolation_level": 0, "session_id": 0, "session_epoch": -1,
                 "topics": [{"topic": "Piped", "partitions": [
                     {"partition": 0, "current_leader_epoch": -1, "fetch_offset": 0,
                      "log_start_offset": -1, "partition_max_bytes": 1 << 20}]}],
                 "forgotten_topics_data": [], "rack_id": ""}
        wire.send(ApiKey.FETCH, 11, 10, fetch)
        wire.send(ApiKey.API_VERSIONS, 0, 11, {})
        wire.send(ApiKey.METADATA, 1, 12, {"topics": None})
        corr = [decode_response(k, v, await wire.frame())[0]
                for k, v in ((ApiKey.FETCH, 11), (ApiKey.API_VERSIONS, 0), (ApiKey.METADATA, 1))]
        assert corr == [10, 11, 12]
    finally:
        wire.close()


async def test_metadata_lists_user_topics_with_one_partition_per_queue(kafka_broker) -> None:
    wire = await Wire.open(kafka_broker.kafka_port)
    try:
        await wire.call(ApiKey.CREATE_TOPICS, 2, 1, {"topics": [_new_topic("Meta", 3)],
                                                     "timeout_ms": 1000, "validate_only": False})
        answer = await wire.call(ApiKey.METADATA, 8, 2, {"topics": None,
                                                         "allow_auto_topic_creation": False})
        assert answer["brokers"] == [{"node_id": 0, "host": "127.0.0.1",
                                      "port": kafka_broker.kafka_port, "rack": None}]
        names = {t["name"]: t for t in answer["topics"]}
        assert list(names) == ["Meta"]  # no system, template, retry or dead-letter topic
        parts = names["Meta"]["partitions"]
        assert [p["partition_index"] for p in parts] == [0, 1, 2]
        assert all(p["leader_id"] == 0 and p["isr_nodes"] == [0] for p in parts)
        v0 = await wire.call(ApiKey.METADATA, 0, 3, {"topics": []})  # v0: empty = all
        assert [t["name"] for t in v0["topics"]] == ["Meta"]
        missing = await wire.call(ApiKey.METADATA, 8, 4, {
            "topics": [{"name": "NoSuch"}, {"name": "bad name!"}],
            "allow_auto_topic_creation": False})
        assert [t["error_code"] for t in missing["topics"]] == [
            ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, ErrorCode.INVALID_TOPIC_EXCEPTION]
        auto = await wire.call(ApiKey.METADATA, 8, 5, {"topics": [{"name": "AutoMade"}],
                                                       "allow_auto_topic_creation": True})
        assert auto["topics"][0]["error_code"] == ErrorCode.NONE
        assert len(auto["topics"][0]["partitions"]) == kafka_broker.config.default_queue_nums
        coord = await wire.call(ApiKey.FIND_COORDINATOR, 2, 6, {"key": "g", "key_type": 1})
        assert (coord["error_code"], coord["node_id"], coord["port"]) == \
            (0, 0, kafka_broker.kafka_port)
    finally:
        wire.close()


async def test_create_topics_rules(kafka_broker) -> None:
    wire = await Wire.open(kafka_broker.kafka_port)
    try:
        answer = await wire.call(ApiKey.CREATE_TOPICS, 4, 1, {"topics": [
            _new_topic("Fine", -1), _new_topic("Fine", 2), {**_new_topic("Rf3", 1),
                                                           "replication_factor": 3},
            _new_topic("has%pct", 1), _new_topic("RMQ_SYS_X", 1)],
            "timeout_ms": 1000, "validate_only": False})
        codes = [(t["name"], t["error_code"]) for t in answer["topics"]]
        assert codes == [("Fine", 0), ("Fine", ErrorCode.TOPIC_ALREADY_EXISTS),
                         ("Rf3", ErrorCode.INVALID_REPLICATION_FACTOR),
                         ("has%pct", ErrorCode.INVALID_TOPIC_EXCEPTION),
                         ("RMQ_SYS_X", ErrorCode.INVALID_TOPIC_EXCEPTION)]
        assert "single node" in answer["topics"][2]["error_message"]
        assert kafka_broker.topics.get("Fine").read_queue_nums == \
            kafka_broker.config.default_queue_nums
        checked = await wire.call(ApiKey.CREATE_TOPICS, 4, 2, {
            "topics": [_new_topic("OnlyChecked", 2)], "timeout_ms": 1000, "validate_only": True})
        assert checked["topics"][0]["error_code"] == 0
        assert kafka_broker.topics.get("OnlyChecked") is None
    finally:
        wire.close()


async def test_stop_answers_a_long_polling_fetch(kafka_broker) -> None:
    wire = await Wire.open(kafka_broker.kafka_port)
    try:
        await wire.call(ApiKey.CREATE_TOPICS, 3, 1, {"topics": [_new_topic("Held", 1)],
                                                     "timeout_ms": 1000, "validate_only": False})
        wire.send(ApiKey.FETCH, 4, 2, {
            "replica_id": -1, "max_wait_ms": 60000, "min_bytes": 1, "max_bytes": 1 << 20,
            "isolation_level": 1, "topics": [{"topic": "Held", "partitions": [
                {"partition": 0, "fetch_offset": 0, "partition_max_bytes": 1 << 20}]}]})
        await asyncio.sleep(0.1)
        stopping = asyncio.create_task(kafka_broker.stop())
        corr, answer = decode_response(ApiKey.FETCH, 4, await wire.frame())
        assert corr == 2 and answer["responses"][0]["partitions"][0]["records"] in (None, b"")
        await asyncio.wait_for(stopping, 10)
    finally:
        wire.close()


def test_kafka_port_clash_is_one_line_from_serve(tmp_path) -> None:
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    try:
        port = taken.getsockname()[1]
        data = tmp_path / "data"
        res = subprocess.run(
            [sys.executable, "-P", "-m", "txbroker", "serve",
             "--data-dir", str(data), "--broker-port", "0", "--namesrv-port", "-1",
             "--kafka-port", str(port)],
            cwd=REPO_ROOT, capture_output=True, text=True, timeout=60, check=False)
    finally:
        taken.close()
    assert res.returncode == 1
    assert res.stderr.splitlines() == [
        f"error: cannot listen on 127.0.0.1:{port} (Kafka port): address already in use"]
    assert not data.exists()


async def test_serve_ready_line_names_the_kafka_port(tmp_path) -> None:
    cmd = [sys.executable, "-P", "-m", "txbroker", "serve",
           "--data-dir", str(tmp_path / "d"), "--broker-port", "0", "--namesrv-port", "-1",
           "--kafka-port", "0", "--segment-size", str(1 << 20),
           "--max-message-size", str(64 << 10)]
    p = await asyncio.create_subprocess_exec(*cmd, cwd=REPO_ROOT, stdout=subprocess.PIPE,
                                             stderr=subprocess.PIPE)
    try:
        line = (await asyncio.wait_for(p.stdout.readline(), 30)).decode().split()
        assert line[:2] == ["txbroker", "ready"] and line[4].startswith("kafka=127.0.0.1:")
        port = int(line[4].rsplit(":", 1)[1])
        wire = await Wire.open(port)
        try:
            assert (await wire.call(ApiKey.API_VERSIONS, 0, 1, {}))["error_code"] == 0
        finally:
            wire.close()
    finally:
        p.terminate()
        _, err = await asyncio.wait_for(p.communicate(), 20)
    assert p.returncode == 0, err
    assert b"  kafka            127.0.0.1:" in err


def _new_topic(name: str, partitions: int) -> dict:
    return {"name": name, "num_partitions": partitions, "replication_factor": -1,
            "assignments": [], "configs": []}


def _raw_request(key: int, version: int, corr: int, body: bytes = b"") -> bytes:
    """A request header v1 by hand (the codec refuses to encode what we do not serve)."""
    client = b"raw"
    payload = (key.to_bytes(2, "big", signed=True) + version.to_bytes(2, "big")
               + corr.to_bytes(4, "big") + len(client).to_bytes(2, "big") + client + body)
    return len(payload).to_bytes(4, "big") + payload


async def test_connections_beyond_max_connections_are_closed(kafka_config) -> None:
    from txbroker.broker import Broker

    async with Broker(kafka_config.replace(max_connections=1)) as broker:
        first = await Wire.open(broker.kafka_port)
        second = None
        try:
            assert (await first.call(ApiKey.API_VERSIONS, 0, 1, {}))["error_code"] == 0
            second = await Wire.open(broker.kafka_port)
            assert await second.closed()
            assert (await first.call(ApiKey.API_VERSIONS, 0, 2, {}))["error_code"] == 0
        finally:
            first.close()
            if second is not None:
                second.close()
