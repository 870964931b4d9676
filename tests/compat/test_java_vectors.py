"""Replay Java 4.9 client requests (``vectors/java_requests.jsonl``) against a real broker.

The vectors come from ``vectors/make_java_vectors.py`` (built from the protocol notes, no
Java client needed).  Each test replays every earlier vector first (their effects, such as
the topic's auto-creation or a heartbeat, are prerequisites), then checks its own vector's
answer over a raw socket with an independent frame reader.
"""

from __future__ import annotations

import asyncio
import json
import re
import struct
from pathlib import Path

import pytest
from rawwire import Wire
from support.waiting import eventually

VECTORS = [json.loads(line) for line in
           (Path(__file__).parent / "vectors" / "java_requests.jsonl").read_text().splitlines()]
NAMES = [v["name"] for v in VECTORS]
OFFSET_MSG_ID = re.compile(r"^[0-9A-F]{32}$")


def opaque_of(frame: bytes) -> int:
    stype = frame[4]
    if stype == 0:
        return json.loads(frame[8:8 + struct.unpack(">i", frame[4:8])[0]])["opaque"]
    return struct.unpack_from(">i", frame, 8 + 5)[0]


async def replay(broker, vec: dict, wires: dict) -> object:
    """Send one vector; for a two-way one return its answer, for a one-way one nothing."""
    port = vec["port"]
    if port not in wires:
        wires[port] = await Wire.open(broker.broker_addr if port == "broker" else broker.namesrv_addr)
    w = wires[port]
    frame = bytes.fromhex(vec["frame_hex"])
    await w.send(frame)
    if vec["oneway"]:
        return None
    answer = await w.read()
    return answer


def stored(broker, topic: str) -> list:
    out = []
    for qid in broker.store.queues().get(topic, []):
        out.extend(broker.store.get(topic, qid, 0, 100).messages())
    return out


@pytest.mark.parametrize("name", NAMES)
async def test_java_vector(broker, name):
    idx = NAMES.index(name)
    wires: dict = {}
    try:
        for earlier in VECTORS[:idx]:
            await replay(broker, earlier, wires)
        vec = VECTORS[idx]
        answer = await replay(broker, vec, wires)
        exp = vec["expect"]
        if vec["oneway"]:
            # Never answered: a ping on the same connection must be the next frame back.
            ping = bytes.fromhex(next(v for v in VECTORS if v["name"] == "route_standard_json")
                                 ["frame_hex"]) if vec["port"] == "namesrv" else None
            probe = ping or _max_offset_probe()
            await wires[vec["port"]].send(probe)
            await expect_only_probe_answer(wires[vec["port"]], probe, name)
        else:
            frame = bytes.fromhex(vec["frame_hex"])
            h = answer.header
            assert answer.serialize_type == exp["serialize_type"], h
            assert h["opaque"] == opaque_of(frame)
            assert h["flag"] & 1, "response bit not set"
            assert h["code"] == exp["code"], h
            if answer.serialize_type == 0:
                assert "extFields" in h, "Java reads MSG_REGION/TRACE_ON from extFields"
                assert all(isinstance(x, str) for x in answer.ext.values()), answer.ext
            for key in exp.get("string_ext", []):
                assert isinstance(answer.ext.get(key), str), (key, answer.ext)
            if "msgId" in exp.get("string_ext", []):
                for mid in answer.ext["msgId"].split(","):
                    assert OFFSET_MSG_ID.match(mid), answer.ext["msgId"]
            for key, value in exp.get("ext", {}).items():
                assert answer.ext.get(key) == value, answer.ext
            if "body_json" in exp:
                assert json.loads(answer.body) == exp["body_json"]
            if "route" in exp:
                check_route(broker, answer.body, exp["route"])
        for want in exp.get("stored", []):
            check_stored(broker, want, answer)
        if "offset" in exp:
            o = exp["offset"]
            assert broker.store.offsets.get(o["group"], o["topic"], o["queue_id"]) == o["value"]
    finally:
        for w in wires.values():
            await w.close()


#: How long the connection must stay silent after the probe's answer.  The broker handles
#: requests concurrently, so an answer to the one-way request may come after the probe's.
QUIET_AFTER_PROBE = 0.4


async def expect_only_probe_answer(wire: Wire, probe: bytes, oneway_name: str) -> None:
    """The next response answers ``probe``, and no other response follows for a while."""
    nxt = await wire.read()
    assert nxt.header["opaque"] == opaque_of(probe), (
        f"one-way request {oneway_name} was answered: {nxt.header}")
    try:
        extra = await asyncio.wait_for(wire.read(), QUIET_AFTER_PROBE)
    except TimeoutError:
        return
    raise AssertionError(f"one-way request {oneway_name} was answered after the probe: "
                         f"{extra.header}")


def _max_offset_probe() -> bytes:
    h = json.dumps({"code": 30, "extFields": {"queueId": "0", "topic": "JavaVecTopic"}, "flag": 0,
                    "language": "JAVA", "opaque": 999, "serializeTypeCurrentRPC": "JSON",
                    "version": 409}, separators=(",", ":")).encode()
    return struct.pack(">ii", 4 + len(h), len(h)) + h


def check_stored(broker, want: dict, answer) -> None:
    msgs = {m.properties.get("UNIQ_KEY"): m for m in stored(broker, "JavaVecTopic")}
    m = msgs.get(want["UNIQ_KEY"])
    assert m is not None, f"{want['UNIQ_KEY']} not stored; have {sorted(msgs)}"
    assert m.body.decode() == want["body"]
    assert m.queue_id == want["queue_id"]
    for key in ("KEYS", "TAGS", "color"):
        if key in want:
            assert m.properties.get(key) == want[key], (key, m.properties)
    if answer is not None and "queueOffset" in answer.ext and want is not None:
        # A single send reports its own offset; a batch reports its first entry's.
        offsets = sorted(x.queue_offset for x in stored(broker, "JavaVecTopic")
                         if x.queue_id == m.queue_id)
        assert int(answer.ext["queueOffset"]) in offsets
        assert answer.ext["queueId"] == str(m.queue_id)


def check_route(broker, body: bytes, form: str) -> None:
    text = body.decode()
    if form == "standard":
        route = json.loads(text)  # must be standard JSON
        [bd] = route["brokerDatas"]
        assert bd["brokerAddrs"] == {"0": broker.broker_addr}
        [qd] = route["queueDatas"]
        assert qd["writeQueueNums"] >= 4 and qd["perm"] & 0x6 == 0x6
    else:
        # fastjson default: the Long map keys are written unquoted, {0:"host:port"}.
        assert re.search(r'"brokerAddrs":\{0:"' + re.escape(broker.broker_addr) + '"\\}', text), text
        with pytest.raises(ValueError):
            json.loads(text)


def _generator():
    """The vector generator module (its encoders build the frames that depend on answers)."""
    import importlib.util

    path = Path(__file__).parent / "vectors" / "make_java_vectors.py"
    spec = importlib.util.spec_from_file_location("make_java_vectors", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("binary", [False, True], ids=["json", "binary"])
async def test_java_transaction_half_then_oneway_end_transaction(broker, binary):
    # A Java TransactionMQProducer: half via SEND_MESSAGE_V2 (sysFlag 4, TRAN_MSG, PGROUP),
    # then END_TRANSACTION one-way naming the half by the offsets of the send answer [4.2, 4.3].
    g = _generator()
    enc = g.binary_frame if binary else g.json_frame
    uniq = g.uniq(99)
    ext = g.send_ext_v2(1, g.props({"TAGS": "TagT", "UNIQ_KEY": uniq, "WAIT": "true",
                                    "TRAN_MSG": "true", "PGROUP": g.PRODUCER_GROUP}))
    ext["f"] = "4"
    w = await Wire.open(broker.broker_addr)
    try:
        await w.send(enc(310, 41, ext, b"java half"))
        sent = await w.read()
        assert sent.serialize_type == (1 if binary else 0)
        assert sent.header["code"] == 0, sent.header
        assert stored(broker, "JavaVecTopic") == []  # invisible while pending
        commit_log_offset = int(sent.ext["msgId"][16:], 16)  # offsetMsgId: ip, port, offset
        await w.send(enc(37, 42, {
            "producerGroup": g.PRODUCER_GROUP, "tranStateTableOffset": sent.ext["queueOffset"],
            "commitLogOffset": str(commit_log_offset), "commitOrRollback": "8",
            "fromTransactionCheck": "false", "msgId": uniq, "transactionId": uniq,
        }, flag=g.FLAG_ONEWAY))
        probe = _max_offset_probe()
        await w.send(probe)
        await expect_only_probe_answer(w, probe, "END_TRANSACTION")
    finally:
        await w.close()
    # the one-way commit is processed concurrently with the probe
    await eventually(lambda: stored(broker, "JavaVecTopic"), 5, "the committed message stored")
    [m] = stored(broker, "JavaVecTopic")
    assert m.body == b"java half" and m.queue_id == 1
    assert m.properties["UNIQ_KEY"] == uniq and "TRAN_MSG" not in m.properties
    assert broker.tx.pending_count() == 0
