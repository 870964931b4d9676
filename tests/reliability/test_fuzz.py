"""Network fuzzing against a running broker while a healthy client keeps working; codec fuzzing."""

from __future__ import annotations

import asyncio

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bench.chaos.fuzz import fuzz_broker
from txbroker.client import Consumer, Message, Producer
from txbroker.remoting.codec import (
    FrameDecoder,
    ProtocolError,
    RemotingCommand,
    decode_frame,
    encode,
)


async def test_fuzzed_broker_keeps_serving_and_answers_errors(broker_process, tmp_path):
    proc = broker_process()
    sent: list[str] = []
    stop = asyncio.Event()

    async def healthy() -> None:
        async with Producer("healthy_pg", proc.namesrv_addr) as producer:
            i = 0
            while not stop.is_set() and i < 400:
                r = await producer.send(Message("HealthyTopic", f"h{i}".encode(), keys=f"h{i}"))
                assert r.send_status.name == "SEND_OK"
                sent.append(f"h{i}")
                i += 1
                await asyncio.sleep(0.01)

    task = asyncio.ensure_future(healthy())
    try:
        stats = await fuzz_broker(proc.broker_addr, seed=11, rounds=300, max_message_size=256 * 1024)
    finally:
        stop.set()
    await task
    assert proc.alive(), proc.log_text()
    assert stats.ok, (stats.silent, stats.accepted, stats.left_open, stats.cases)
    assert len(stats.cases) >= 25, stats.cases
    assert len(sent) >= 10

    # The store stays valid: after a SIGKILL the restarted broker serves every healthy message.
    proc.kill()
    proc.start()
    got: set[str] = set()
    consumer = Consumer("healthy_cg", proc.namesrv_addr, from_where="first", long_poll_timeout=1.0)
    consumer.subscribe("HealthyTopic")
    async with consumer:
        for _ in range(len(sent) * 2 + 50):
            msg = await consumer.poll(2.0)
            if msg is None:
                break
            got.add(msg.keys)
            if got >= set(sent):
                break
    assert got == set(sent)
    async with Producer("healthy_pg", proc.namesrv_addr) as producer:
        assert (await producer.send(Message("HealthyTopic", b"after"))).send_status.name == "SEND_OK"


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=512), st.integers(min_value=1, max_value=64))
def test_decoder_on_arbitrary_bytes_yields_commands_or_protocol_error(data, chunk):
    decoder = FrameDecoder(4096)
    try:
        for i in range(0, len(data), chunk):
            for cmd in decoder.feed(data[i:i + chunk]):
                assert isinstance(cmd, RemotingCommand)
    except ProtocolError:
        pass


ext_values = st.dictionaries(st.text(min_size=1, max_size=12), st.text(max_size=40), max_size=6)


@settings(max_examples=200, deadline=None)
@given(code=st.integers(min_value=0, max_value=32767), opaque=st.integers(min_value=0, max_value=2**31 - 1),
       ext=ext_values, body=st.binary(max_size=256), remark=st.none() | st.text(max_size=40))
def test_encode_decode_round_trip(code, opaque, ext, body, remark):
    cmd = RemotingCommand.request(code, ext, body, opaque=opaque)
    cmd.remark = remark
    back = decode_frame(encode(cmd))
    assert (back.code, back.opaque, back.ext_fields, back.body, back.remark) == \
        (code, opaque, ext, body, remark)


@settings(max_examples=200, deadline=None)
@given(ext=ext_values, body=st.binary(max_size=64), flips=st.lists(
    st.tuples(st.integers(min_value=0, max_value=10_000), st.integers(min_value=1, max_value=255)),
    min_size=1, max_size=4))
def test_damaged_frames_raise_only_protocol_error(ext, body, flips):
    data = bytearray(encode(RemotingCommand.request(10, ext, body, opaque=1)))
    for pos, x in flips:
        data[pos % len(data)] ^= x
    try:
        FrameDecoder(1 << 20).feed(bytes(data))
    except ProtocolError:
        pass
