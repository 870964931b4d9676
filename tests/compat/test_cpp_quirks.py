"""Every quirk of the C++ client (docs/protocol.md §8), replayed byte-exact over a raw socket.

The frames are the captured ones in ``tests/vectors/`` (header text exactly as the client
wrote it, newline included); only topic-independent fields are reused, so these tests need
no client library and pin down each quirk on its own.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

from rawwire import Frame, Wire
from support.waiting import eventually

CAPTURES = Path(__file__).resolve().parents[1] / "vectors"
CPP_TOPIC = "TopicTest"  # the topic the capture used


def captured(name: str, code: int, nth: int = 0) -> tuple[dict, bytes]:
    """The ``nth`` request with ``code`` in capture ``name``: (header, raw frame bytes)."""
    hits = [json.loads(line) for line in (CAPTURES / f"{name}.jsonl").read_text().splitlines()]
    rec = [r for r in hits if r.get("dir") == "in" and r.get("code") == code][nth]
    return rec, rec["header_raw"].encode()


def frame(header_raw: bytes, body: bytes = b"") -> bytes:
    return struct.pack(">ii", 4 + len(header_raw) + len(body), len(header_raw)) + header_raw + body


def reheader(header_raw: bytes, **changes) -> bytes:
    """The captured header with some fields changed, written the way the C++ client writes."""
    h = json.loads(header_raw)
    ext = h["extFields"]
    for k, v in changes.items():
        if k in ("opaque", "flag"):
            h[k] = v
        else:
            ext[k] = v
    return (json.dumps(h, sort_keys=True, separators=(",", ":")) + "\n").encode()


def batch_body(rec: dict) -> bytes:
    out = b""
    for m in rec["body"]["messages"]:
        body, props = m["body"].encode(), m["properties_raw"].encode()
        out += struct.pack(">iiiii", 20 + len(body) + 2 + len(props), 0, 0, m["flag"], len(body))
        out += body + struct.pack(">h", len(props)) + props
    return out


def assert_cpp_safe(f: Frame, opaque: int) -> None:
    """What the C++ client needs in every answer (docs/protocol.md §8.3): JSON, response bit, its opaque,
    an extFields object (it segfaults without one) whose values are JSON strings."""
    assert f.serialize_type == 0, "C++ 1.2.3 reads only JSON headers"
    assert f.header["flag"] & 1
    assert f.header["opaque"] == opaque
    assert isinstance(f.header.get("extFields"), dict), f.header
    assert all(isinstance(v, str) for v in f.header["extFields"].values()), f.header


async def test_numeric_ext_fields_and_0_1_booleans_in_send(broker):
    rec, raw = captured("send_sync", 10)
    ext = rec["header"]["extFields"]
    assert isinstance(ext["queueId"], int) and ext["unitMode"] == "0"  # the quirk is in the data
    w = await Wire.open(broker.broker_addr)
    try:
        await w.send(frame(raw, b"hello txbroker"))
        f = await w.read()
    finally:
        await w.close()
    assert_cpp_safe(f, rec["header"]["opaque"])
    assert f.header["code"] == 0
    assert {"msgId", "queueId", "queueOffset"} <= f.ext.keys()
    [m] = broker.store.get(CPP_TOPIC, 0, 0, 10).messages()
    assert m.body == b"hello txbroker"
    assert m.properties["color"] == "red" and m.keys == "KEY1 KEY2"
    assert f.ext["queueOffset"] == str(m.queue_offset) and f.ext["queueId"] == "0"


async def test_batch_is_code_10_with_batch_string_1(broker):
    rec, raw = captured("send_batch", 10)
    assert rec["header"]["extFields"]["batch"] == "1"
    w = await Wire.open(broker.broker_addr)
    try:
        await w.send(frame(raw, batch_body(rec)))
        f = await w.read()
    finally:
        await w.close()
    assert_cpp_safe(f, rec["header"]["opaque"])
    assert f.header["code"] == 0
    msgs = broker.store.get(CPP_TOPIC, 0, 0, 10).messages()
    assert [m.body for m in msgs] == [b"batch body %d" % i for i in range(3)]
    assert [m.keys for m in msgs] == ["BK0", "BK1", "BK2"]


async def test_oneway_send_without_the_bit_is_stored_and_its_answer_is_harmless(broker):
    rec, raw = captured("send_oneway", 10)
    assert rec["header"]["flag"] == 0
    w = await Wire.open(broker.broker_addr)
    try:
        await w.send(frame(raw, b"oneway body"))
        f = await w.read()  # answered: the broker cannot tell, the client drops it
    finally:
        await w.close()
    assert_cpp_safe(f, rec["header"]["opaque"])
    assert [m.body for m in broker.store.get(CPP_TOPIC, 0, 0, 10).messages()] == [b"oneway body"]


async def test_ordinal_heartbeat_then_consumer_list(broker):
    rec, raw = captured("push_consumer", 34)
    body = json.dumps(rec["body"]["json"], sort_keys=True, separators=(",", ":")).encode()
    client_id = rec["body"]["json"]["clientID"]
    _, list_raw = captured("push_consumer", 38)
    w = await Wire.open(broker.broker_addr)
    try:
        await w.send(frame(raw, body))
        hb = await w.read()
        await w.send(frame(reheader(list_raw, opaque=500)))
        lst = await w.read()
    finally:
        await w.close()
    assert_cpp_safe(hb, rec["header"]["opaque"])
    assert hb.header["code"] == 0
    assert_cpp_safe(lst, 500)
    assert json.loads(lst.body) == {"consumerIdList": [client_id]}


async def test_late_heartbeat_check_back_reaches_the_sending_connection(broker):
    # The producer sends its half before any HEART_BEAT (docs/protocol.md §8.7): the check must still find it,
    # on that connection, with every header value a JSON string (C++ reads only strings).
    rec, raw = captured("send_tx_props", 10)
    assert rec["header"]["extFields"]["sysFlag"] == 4
    w = await Wire.open(broker.broker_addr)
    try:
        await w.send(frame(raw, b"half message body"))
        sent = await w.read()
        assert_cpp_safe(sent, rec["header"]["opaque"])
        assert broker.tx.pending_count() == 1

        async def check_arrived() -> bool:
            # a pass checks the half once it is past its immunity (transaction_timeout)
            await broker.tx.check_now()
            try:
                await w.read(timeout=0.05)  # sets aside a check request that arrived
            except TimeoutError:
                pass
            return bool(w.server_requests)

        await eventually(check_arrived, 5, "a CHECK_TRANSACTION_STATE reaching the producer's connection")
        check = w.server_requests[0]
    finally:
        await w.close()
    assert check.header["code"] == 39
    assert check.header["flag"] & 2  # one-way
    assert all(isinstance(v, str) for v in check.ext.values()), check.ext
    uniq = rec["header"]["extFields"]["properties"].split("UNIQ_KEY\x01")[1].split("\x02")[0]
    assert check.ext["msgId"] == uniq
    assert check.ext["commitLogOffset"].isdigit() and check.ext["tranStateTableOffset"].isdigit()


async def test_eight_held_pulls_on_one_connection_do_not_block_other_requests(broker):
    _, raw = captured("push_consumer", 11)
    h = json.loads(raw)
    assert h["extFields"]["sysFlag"] & 2  # suspend
    w = await Wire.open(broker.broker_addr)
    try:
        # The consumer's subscription: its heartbeat first, as the client does.
        hb, hb_raw = captured("push_consumer", 34)
        await w.send(frame(hb_raw, json.dumps(hb["body"]["json"], sort_keys=True,
                                              separators=(",", ":")).encode()))
        await w.read()
        # Two 4-queue topics exist (one message in each queue 0), as when a consumer starts.
        topics = [CPP_TOPIC, CPP_TOPIC + "2"]
        _, raw_s = captured("send_sync", 10)
        for n, topic in enumerate(topics):
            await w.send(frame(reheader(raw_s, opaque=900 + n, topic=topic, queueId=0), b"first"))
            assert (await w.read()).header["code"] == 0
        for i, (topic, qid) in enumerate((t, q) for t in topics for q in range(4)):
            await w.send(frame(reheader(raw, opaque=1000 + i, topic=topic, queueId=qid,
                                        queueOffset="1" if qid == 0 else "0", subscription="*",
                                        suspendTimeoutMillis="15000")))
        # While 8 pulls are held, other requests on the same connection answer at once.
        _, qco_raw = captured("push_consumer", 14)
        await w.send(frame(reheader(qco_raw, opaque=2000, topic=CPP_TOPIC, queueId=1)))
        f = await w.read(timeout=3.0)  # the client's own time-out; it reconnects after it
        assert f.header["opaque"] == 2000, (f.header, f.ext)
        assert_cpp_safe(f, 2000)
        # A message for queue 2 releases that queue's held pull with a SUCCESS.
        await w.send(frame(reheader(raw_s, opaque=3000, queueId=2), b"wake queue 2"))
        answers = {}
        while 1002 not in answers or 3000 not in answers:
            f = await w.read(timeout=5.0)
            answers[f.header["opaque"]] = f
    finally:
        await w.close()
    pull = answers[1002]
    assert_cpp_safe(pull, 1002)
    assert pull.header["code"] == 0
    for key in ("nextBeginOffset", "minOffset", "maxOffset", "suggestWhichBrokerId"):
        assert isinstance(pull.ext[key], str), pull.ext  # C++ ignores non-string values
    assert pull.ext["nextBeginOffset"] == "1"
    assert b"wake queue 2" in pull.body


async def test_update_offset_without_oneway_bit_is_stored(broker):
    rec, raw = captured("push_consumer", 15)
    assert rec["header"]["flag"] == 0
    await broker.topics.get_or_create(CPP_TOPIC)  # offsets are stored for existing topics only
    w = await Wire.open(broker.broker_addr)
    try:
        await w.send(frame(reheader(raw, opaque=700, commitOffset="2", queueId=1)))
        f = await w.read()
    finally:
        await w.close()
    assert_cpp_safe(f, 700)
    group = rec["header"]["extFields"]["consumerGroup"]
    topic = rec["header"]["extFields"]["topic"]
    assert broker.store.offsets.get(group, topic, 1) == 2


async def test_unknown_code_and_errors_still_carry_ext_fields(broker):
    # Error answers go to the same client: they too must be JSON with an extFields object.
    _, raw = captured("send_sync", 10)
    w = await Wire.open(broker.broker_addr)
    try:
        await w.send(frame(reheader(raw, opaque=801, topic="")))  # invalid topic
        bad = await w.read()
        h = json.loads(raw)
        h.update(code=9999, opaque=802)
        await w.send(frame((json.dumps(h, sort_keys=True, separators=(",", ":")) + "\n").encode()))
        unknown = await w.read()
    finally:
        await w.close()
    assert_cpp_safe(bad, 801)
    assert bad.header["code"] != 0
    assert_cpp_safe(unknown, 802)
    assert unknown.header["code"] == 3  # REQUEST_CODE_NOT_SUPPORTED
