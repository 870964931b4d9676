"""TransactionalMessageService on a real MessageStore (temp dir) and real TCP connections
(support.txnode: a manual clock, check passes through ``check_now()``, never sleeping)."""

from __future__ import annotations

import asyncio
import socket
import time

import orjson
import pytest
from support.clock import ManualClock
from support.txnode import (
    COMMIT,
    GROUP,
    ROLLBACK,
    TIMEOUT,
    UNKNOWN,
    Producer,
    end,
    end_cmd,
    half_msg,
    op_records,
    open_node,
    prepare,
    tx_config,
    visible,
)
from support.waiting import eventually

from txbroker.remoting.codec import encode
from txbroker.remoting.codes import RequestCode, ResponseCode
from txbroker.remoting.command import RemotingCommand
from txbroker.service.processors.transaction import transaction_handlers
from txbroker.service.transaction.messages import final_message
from txbroker.service.transaction.state import (
    ConflictError,
    HalfState,
    Outcome,
    TransactionError,
)
from txbroker.store.record import (
    BORNHOST_V6_FLAG,
    CHECK_MAX_TIME_TOPIC,
    STOREHOST_V6_FLAG,
    TRANSACTION_COMMIT_TYPE,
    TRANSACTION_MASK,
    Message,
    decode_offset_msg_id,
    decode_record,
    encode_record,
)


@pytest.fixture
async def node(tmp_path):
    n = await open_node(tx_config(tmp_path / "data"), ManualClock())
    try:
        yield n
    finally:
        await n.close()


# --- prepare / commit / rollback -------------------------------------------------------------

async def test_half_is_stored_in_the_half_topic_and_invisible(node) -> None:
    result = await prepare(node)
    half = node.store.read(result.physical_offset)
    assert half.topic == "RMQ_SYS_TRANS_HALF_TOPIC" and half.queue_id == 0
    assert half.properties["REAL_TOPIC"] == "TxT" and half.properties["REAL_QID"] == "1"
    assert half.sys_flag & TRANSACTION_MASK == 0
    assert decode_offset_msg_id(result.msg_id)[2] == result.physical_offset
    assert result.queue_offset == half.queue_offset == 0
    assert visible(node) == []
    assert node.tx.pending_count() == 1
    assert node.metrics.snapshot()["tx_halves_total"] == "1"


async def test_commit_visible_in_real_topic(node) -> None:
    result = await prepare(node, body=b"commit-me")
    node.clock.advance(1.5)
    assert await end(node, result, COMMIT) is Outcome.APPLY
    [msg] = visible(node)
    half = node.store.read(result.physical_offset)
    assert msg.body == b"commit-me"
    assert msg.sys_flag & TRANSACTION_MASK == TRANSACTION_COMMIT_TYPE
    assert msg.prepared_transaction_offset == result.physical_offset
    assert msg.store_timestamp == half.store_timestamp
    assert {"TRAN_MSG", "REAL_TOPIC", "REAL_QID"}.isdisjoint(msg.properties)
    assert msg.properties["__transactionId__"] == "U1" and msg.properties["TAGS"] == "TagA"
    [op] = op_records(node)
    assert op.tags == "d" and op.body == str(result.queue_offset).encode()
    assert node.tx.pending_count() == 0
    assert node.tx.state_of(result.physical_offset) is HalfState.COMMITTED
    snap = node.metrics.snapshot()
    assert snap["tx_commits_total_producer"] == "1"
    assert snap["tx_decision_latency_seconds_count"] == "1"
    assert float(snap["tx_decision_latency_seconds_sum"]) == pytest.approx(1.5, abs=0.01)


@pytest.mark.parametrize("variant", ["plain", "odd"])
async def test_commit_from_the_cached_half_writes_what_a_read_back_would(node, variant) -> None:
    # A commit builds the final message from the half it cached at prepare time; that must be
    # byte for byte what reading the stored half back would give (IPv6 markers, an IPv6 born
    # host and non-ASCII properties included, which the store normalises when encoding).
    if variant == "plain":
        msg = half_msg(b"cached")
    else:
        msg = half_msg("é\u2603".encode(), uniq="U-odd", note="\u00fcber \U0001F600", empty="")
        msg.sys_flag |= BORNHOST_V6_FLAG | STOREHOST_V6_FLAG
        msg.born_host = ("::1", 6000)
    result = await node.tx.prepare(msg, None)
    phys, ts = result.physical_offset, result.store_timestamp
    cached = node.tx._recall(phys)
    read_back = node.tx.read_half(phys)
    assert cached is not None and read_back is not None

    def final_bytes(half) -> bytes:
        return encode_record(final_message(half, phys, ts), physical_offset=0,
                             queue_offset=0, store_timestamp=ts, store_host=("127.0.0.1", 10911))

    assert final_bytes(cached) == final_bytes(read_back)
    node.tx._remember(phys, cached)
    assert await end(node, result, COMMIT) is Outcome.APPLY
    [final] = visible(node)
    assert final.body == msg.body and final.prepared_transaction_offset == phys
    assert node.tx._recall(phys) is None  # decided halves leave the cache


async def test_rollback_never_visible(node) -> None:
    result = await prepare(node)
    assert await end(node, result, ROLLBACK) is Outcome.APPLY
    [op] = op_records(node)
    assert op.tags == "d" and op.properties["TXB_STATE"] == "rolled_back"
    node.clock.advance(3600)
    report = await node.tx.check_now()
    assert report.due == 0 and report.sent == 0
    assert visible(node) == []
    assert node.tx.state_of(result.physical_offset) is HalfState.ROLLED_BACK


async def test_unknown_writes_nothing(node) -> None:
    result = await prepare(node)
    before = node.store.max_physical_offset
    assert await end(node, result, UNKNOWN) is None
    assert node.store.max_physical_offset == before
    assert node.tx.state_of(result.physical_offset) is HalfState.PENDING
    assert node.metrics.snapshot()["tx_unknown_ends_total"] == "1"


async def test_delay_level_and_bad_properties_refused(node) -> None:
    before = node.store.max_physical_offset
    with pytest.raises(TransactionError) as err:
        await node.tx.prepare(half_msg(DELAY="3"), None)
    assert err.value.code == ResponseCode.MESSAGE_ILLEGAL and "delay" in err.value.remark
    for bad in ("soon", "-5", "²"):
        with pytest.raises(TransactionError):
            await node.tx.prepare(half_msg(CHECK_IMMUNITY_TIME_IN_SECONDS=bad), None)
    msg = half_msg()
    del msg.properties["PGROUP"]
    with pytest.raises(TransactionError):
        await node.tx.prepare(msg, None)
    assert node.store.max_physical_offset == before
    assert node.tx.pending_count() == 0


# --- idempotence and conflicts -----------------------------------------------------------------

async def test_duplicate_commit_writes_one_message(node) -> None:
    result = await prepare(node)
    assert await end(node, result, COMMIT) is Outcome.APPLY
    end_of_log = node.store.max_physical_offset
    assert await end(node, result, COMMIT) is Outcome.DUPLICATE
    assert await end(node, result, COMMIT, from_check=True) is Outcome.DUPLICATE
    assert node.store.max_physical_offset == end_of_log
    assert len(visible(node)) == 1 and len(op_records(node)) == 1
    assert node.metrics.snapshot()["tx_duplicate_ends_total"] == "2"


async def test_conflicting_decisions_refused(node) -> None:
    committed = await prepare(node, uniq="UC")
    rolled = await prepare(node, uniq="UR")
    await end(node, committed, COMMIT)
    await end(node, rolled, ROLLBACK)
    end_of_log = node.store.max_physical_offset
    with pytest.raises(ConflictError) as err:
        await end(node, committed, ROLLBACK)
    assert err.value.code == ResponseCode.TRANSACTION_FAILED and "committed" in err.value.remark
    with pytest.raises(ConflictError):
        await end(node, rolled, COMMIT)
    assert node.store.max_physical_offset == end_of_log
    assert [m.body for m in visible(node)] == [b"payload"]
    assert node.metrics.snapshot()["tx_conflicting_ends_total"] == "2"


async def test_racing_commits_produce_one_message(tmp_path) -> None:
    # sync flush: every put awaits its group commit, so the racing decisions really interleave
    node = await open_node(tx_config(tmp_path / "data", flush_mode="sync"), ManualClock())
    try:
        results = [await prepare(node, uniq=f"R{i}") for i in range(5)]
        outcomes = await asyncio.gather(*(end(node, r, COMMIT, from_check=check)
                                          for r in results for check in (False, True)))
        assert sorted(o.value for o in outcomes) == ["apply"] * 5 + ["duplicate"] * 5
        assert len(visible(node)) == 5 and len(op_records(node)) == 5
        # a rollback racing a commit: exactly one of them wins, the other is refused
        r = await prepare(node, uniq="RC")
        outcomes = await asyncio.gather(end(node, r, COMMIT), end(node, r, ROLLBACK),
                                        return_exceptions=True)
        assert sum(o is Outcome.APPLY for o in outcomes) == 1
        assert sum(isinstance(o, ConflictError) for o in outcomes) == 1
        committed = outcomes[0] is Outcome.APPLY
        assert len(visible(node)) == (6 if committed else 5) and len(op_records(node)) == 6
    finally:
        await node.close()


async def test_end_transaction_validation(node) -> None:
    result = await prepare(node)
    plain = await node.store.put(Message(topic="Plain", queue_id=0, body=b"x"))
    end_of_log = node.store.max_physical_offset
    with pytest.raises(TransactionError) as err:
        await end(node, result, COMMIT, group="OTHER")
    assert err.value.remark == "The producer group wrong"
    with pytest.raises(TransactionError) as err:
        await node.tx.end_transaction(commit_log_offset=result.physical_offset,
                                      tran_state_table_offset=result.queue_offset + 7,
                                      producer_group=GROUP, commit_or_rollback=COMMIT)
    assert err.value.remark == "The transaction state table offset wrong"
    for bad_offset in (plain.physical_offset, result.physical_offset + 3, 10**12):
        with pytest.raises(TransactionError) as err:
            await node.tx.end_transaction(commit_log_offset=bad_offset, tran_state_table_offset=0,
                                          producer_group=GROUP, commit_or_rollback=COMMIT)
        assert err.value.remark == "Find prepared transaction message failed"
    assert node.store.max_physical_offset == end_of_log
    assert node.tx.state_of(result.physical_offset) is HalfState.PENDING
    assert node.metrics.snapshot()["tx_invalid_ends_total"] == "5"


async def test_end_transaction_over_tcp(node) -> None:
    producer = await Producer(node).start()
    try:
        result = await prepare(node, conn=producer.conn)
        c = producer.client
        # C++ style: flag 0, answered
        resp = await c.invoke(end_cmd(result.physical_offset, result.queue_offset, COMMIT), TIMEOUT)
        assert resp.code == ResponseCode.SUCCESS
        resp = await c.invoke(end_cmd(result.physical_offset, result.queue_offset, ROLLBACK), TIMEOUT)
        assert resp.code == ResponseCode.TRANSACTION_FAILED and "committed" in resp.remark
        resp = await c.invoke(end_cmd(result.physical_offset, result.queue_offset, COMMIT,
                                      group="WRONG"), TIMEOUT)
        assert resp.code == ResponseCode.SYSTEM_ERROR and resp.remark == "The producer group wrong"
        bad = end_cmd(result.physical_offset, result.queue_offset, 5)
        resp = await c.invoke(bad, TIMEOUT)
        assert resp.code == ResponseCode.SYSTEM_ERROR and "commitOrRollback" in resp.remark
        missing = end_cmd(result.physical_offset, result.queue_offset, COMMIT)
        del missing.ext_fields["producerGroup"]
        resp = await c.invoke(missing, TIMEOUT)
        assert resp.code == ResponseCode.SYSTEM_ERROR and "producerGroup" in resp.remark
        # Java style one-way: the handler raises its refusal like any other, and the transport
        # leaves a one-way refusal unanswered (tests/remoting/test_remoting_refusal.py)
        handler = transaction_handlers(node.tx)[RequestCode.END_TRANSACTION]
        with pytest.raises(ConflictError):
            await handler(producer.conn, end_cmd(result.physical_offset, result.queue_offset,
                                                 ROLLBACK, oneway=True))
        assert len(visible(node)) == 1
    finally:
        await producer.close()


# --- check-back ----------------------------------------------------------------------------------

@pytest.mark.parametrize("answer", [COMMIT, ROLLBACK])
async def test_unknown_then_check_back_decides(node, answer) -> None:
    producer = await Producer(node, answer=answer).start()
    try:
        result = await prepare(node, conn=producer.conn, body=b"checked")
        await end(node, result, UNKNOWN)
        node.clock.advance(5.9)
        assert (await node.tx.check_now()).sent == 0  # still immune
        node.clock.advance(0.2)
        report = await node.tx.check_now()
        assert report.due == 1 and report.sent == 1
        await producer.wait_checks(1)
        check = producer.checks[0]
        assert check.is_oneway
        ext = check.ext_fields
        assert ext["commitLogOffset"] == str(result.physical_offset)
        assert ext["tranStateTableOffset"] == str(result.queue_offset)
        assert ext["msgId"] == ext["transactionId"] == "U1"
        assert ext["offsetMsgId"] == result.msg_id
        body = decode_record(check.body, check_crc=True)
        assert (body.topic, body.queue_id, body.body) == ("TxT", 1, b"checked")
        assert body.properties["PGROUP"] == GROUP
        await eventually(lambda: node.tx.pending_count() == 0)
        expected = [b"checked"] if answer == COMMIT else []
        assert [m.body for m in visible(node)] == expected
        kind = "commit" if answer == COMMIT else "rollback"
        snap = node.metrics.snapshot()
        assert snap[f"tx_check_answers_total_{kind}"] == "1"
        assert snap[f"tx_{kind}s_total_check"] == "1"
        assert snap["tx_checks_sent_total"] == "1"
    finally:
        await producer.close()


async def test_no_producer_online_burns_no_check(node) -> None:
    result = await prepare(node, conn=None)
    node.clock.advance(60)
    for _ in range(5):  # more passes than transaction_check_max
        report = await node.tx.check_now()
        assert report.sent == 0 and report.no_producer == 1
        assert report.no_producer_groups == {GROUP: 1}
    entry = node.tx.entry(result.physical_offset)
    assert entry.checks == 0 and entry.state is HalfState.PENDING
    assert node.metrics.snapshot()["tx_no_producer_total"] == "5"
    assert op_records(node) == []  # nothing persisted for checks never sent
    # a producer of the group comes online: the next pass checks through it
    producer = await Producer(node).start()
    try:
        assert (await node.tx.check_now()).sent == 1
        await producer.wait_checks(1)
        assert entry.checks == 1
    finally:
        await producer.close()


async def test_checks_to_a_producer_that_stops_reading_wait_and_are_not_counted(tmp_path) -> None:
    # A producer that stops reading its socket: each check carries a 256 KiB half, and 40 of
    # them are far more than the kernel's socket buffers hold.  The broker must stop sending
    # once the connection is above its high-water mark (memory stays bounded), count only what
    # it sent, and send the rest at later passes once the producer reads again.
    cfg = tx_config(tmp_path / "data", segment_size=64 * 1024 * 1024, max_message_size=512 * 1024,
                    transaction_check_max=100)
    node = await open_node(cfg, ManualClock())
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.setblocking(False)
    loop = asyncio.get_running_loop()
    try:
        await loop.sock_connect(sock, ("127.0.0.1", node.port))
        await loop.sock_sendall(sock, encode(RemotingCommand.request(RequestCode.HEART_BEAT,
                                                                     {"group": GROUP})))
        await eventually(lambda: len(node.conns) == 1)
        conn = node.conns[0]
        for i in range(40):
            await prepare(node, conn, body=bytes([i]) * (256 * 1024), uniq=f"S{i}")
        node.clock.advance(60)
        report = await node.tx.check_now()
        assert report.due == 40 and 0 < report.sent < 40
        assert report.deferred == 40 - report.sent
        assert not conn.writable
        # What waits in the broker for this producer is bounded by the high-water mark plus
        # the one check that crossed it, not 40 halves.
        assert conn.transport.get_write_buffer_size() < 2 * (256 * 1024) + 128 * 1024
        entries = [e for e in node.tx.pending_entries()]
        assert sum(e.checks for e in entries) == report.sent  # deferred checks are not counted
        # The producer reads again: later passes send the rest.
        received = 0
        deadline = time.monotonic() + TIMEOUT
        while min(e.checks for e in entries) == 0:
            assert time.monotonic() < deadline, "deferred checks never sent"
            try:
                received += len(await asyncio.wait_for(loop.sock_recv(sock, 1 << 20), 0.05))
            except TimeoutError:
                pass
            if conn.writable:
                await node.tx.check_now()
        assert received > 0
    finally:
        sock.close()
        await node.close()


async def test_no_checks_while_the_store_refuses_writes(tmp_path) -> None:
    # With the disk guard refusing writes a commit answer cannot be applied: checks would
    # only burn counts until the half is discarded although its producer committed.
    usage = {"used": 50}
    node = await open_node(tx_config(tmp_path / "data", disk_max_used_ratio=0.9), ManualClock(),
                           disk_usage=lambda _p: (100, usage["used"], 100 - usage["used"]))
    producer = await Producer(node, answer=COMMIT).start()
    try:
        result = await prepare(node, producer.conn)
        node.clock.advance(60)
        usage["used"] = 95
        node.store.recheck_disk()
        for _ in range(5):  # more passes than transaction_check_max (3)
            report = await node.tx.check_now()
            assert report.sent == 0 and report.discarded == 0 and "disk" in report.skipped
        assert node.tx.entry(result.physical_offset).checks == 0 and producer.checks == []
        usage["used"] = 50
        node.store.recheck_disk()
        assert (await node.tx.check_now()).sent == 1
        await eventually(lambda: node.tx.pending_count() == 0)
        assert [m.body for m in visible(node)] == [b"payload"]
    finally:
        await producer.close()
        await node.close()


async def test_check_goes_to_the_sending_connection_first(node) -> None:
    sender = await Producer(node).start()
    other = await Producer(node).start()  # most recently active member of the group
    try:
        await prepare(node, conn=sender.conn)
        node.clock.advance(10)
        await node.tx.check_now()
        await sender.wait_checks(1)
        assert other.checks == []
        await sender.close()
        await eventually(lambda: sender.conn.closed)
        node.clock.advance(10)
        assert (await node.tx.check_now()).sent == 1
        await other.wait_checks(1)
    finally:
        await other.close()


async def test_a_check_lost_with_its_closing_connection_is_not_counted(node) -> None:
    # A producer instance shutting down as a check goes out never answers it: the count it
    # burned is given back, so the half is not discarded for checks nobody received.
    dying = await Producer(node).start()  # receives the check, closes without answering
    try:
        result = await prepare(node, conn=dying.conn)
        phys = result.physical_offset
        node.clock.advance(10)
        assert (await node.tx.check_now()).sent == 1
        await dying.wait_checks(1)
        assert node.tx.entry(phys).checks == 1
    finally:
        await dying.close()
    await eventually(lambda: dying.conn.closed)
    answering = await Producer(node, answer=UNKNOWN).start()
    try:
        node.clock.advance(10)
        report = await node.tx.check_now()
        assert report.lost == 1 and report.sent == 1
        assert "1 earlier checks lost with their connection" in report.describe()
        await answering.wait_checks(1)
        assert node.tx.entry(phys).checks == 1  # given back, then counted again
        assert node.metrics.snapshot()["tx_checks_lost_total"] == "1"
        # An answer (UNKNOW here) means the check arrived: closing afterwards gives nothing
        # back, and the half is discarded after transaction_check_max answered checks.
        await eventually(lambda: node.metrics.snapshot().get("tx_check_answers_total_unknown") == "1")
    finally:
        await answering.close()
    await eventually(lambda: answering.conn.closed)
    last = await Producer(node, answer=UNKNOWN).start()
    try:
        node.clock.advance(10)
        report = await node.tx.check_now()
        assert report.lost == 0 and report.sent == 1
        assert node.tx.entry(phys).checks == 2
        await last.wait_checks(1)
        await eventually(lambda: node.metrics.snapshot().get("tx_check_answers_total_unknown") == "2")
        node.clock.advance(10)
        assert (await node.tx.check_now()).sent == 1
        await eventually(lambda: node.metrics.snapshot().get("tx_check_answers_total_unknown") == "3")
        node.clock.advance(10)
        assert (await node.tx.check_now()).discarded == 1
    finally:
        await last.close()


async def test_a_group_whose_instances_keep_dying_still_ends_in_a_discard(node) -> None:
    # Checks given back are bounded (transaction_check_max per half): a producer group whose
    # every instance dies before answering does not keep a half pending for ever.
    result = await prepare(node, conn=None)
    phys = result.physical_offset
    passes = 0
    while node.tx.state_of(phys) is HalfState.PENDING:
        passes += 1
        assert passes <= 10, "the half was never discarded"
        producer = await Producer(node).start()  # never answers
        node.clock.advance(10)
        report = await node.tx.check_now()
        if report.sent:
            await producer.wait_checks(1)
        await producer.close()
        await eventually(lambda p=producer: p.conn.closed)
    assert node.tx.state_of(phys) is HalfState.DISCARDED
    # 3 counted checks, 3 given back, then the discard pass: 3 + 3 + 1.
    assert passes == 7
    assert node.metrics.snapshot()["tx_checks_lost_total"] == "3"


async def test_clock_skewed_born_timestamps_do_not_cause_early_checks(node) -> None:
    producer = await Producer(node).start()
    try:
        hour_ms = 3600 * 1000
        now_ms = int(node.clock() * 1000)
        await prepare(node, conn=producer.conn, uniq="PAST", born=now_ms - hour_ms)
        await prepare(node, conn=producer.conn, uniq="FUTURE", born=now_ms + hour_ms)
        await prepare(node, conn=producer.conn, uniq="LONG", CHECK_IMMUNITY_TIME_IN_SECONDS="60")
        node.clock.advance(5)
        assert (await node.tx.check_now()).sent == 0
        node.clock.advance(2)
        report = await node.tx.check_now()
        assert report.sent == 2
        await producer.wait_checks(2)
        assert sorted(c.ext_fields["msgId"] for c in producer.checks) == ["FUTURE", "PAST"]
        node.clock.advance(60)
        await node.tx.check_now()
        await producer.wait_checks(5)
        assert sorted(c.ext_fields["msgId"] for c in producer.checks[2:]) == ["FUTURE", "LONG", "PAST"]
    finally:
        await producer.close()


async def test_check_max_discard_then_operator_resume(node) -> None:
    producer = await Producer(node).start()  # never answers
    try:
        result = await prepare(node, conn=producer.conn, body=b"hanging")
        phys = result.physical_offset
        for n in range(1, 4):
            node.clock.advance(10)
            assert (await node.tx.check_now()).sent == 1
            assert node.tx.entry(phys).checks == n
        node.clock.advance(10)
        report = await node.tx.check_now()
        assert report.discarded == 1 and report.sent == 0
        assert node.tx.state_of(phys) is HalfState.DISCARDED
        assert node.tx.pending_count() == 0
        [copy] = visible(node, CHECK_MAX_TIME_TOPIC, 0)
        assert copy.body == b"hanging" and copy.properties["TRANSACTION_CHECK_TIMES"] == "3"
        assert visible(node) == []
        node.clock.advance(10)
        assert (await node.tx.check_now()).sent == 0  # a discarded half is not checked
        # the producer's late commit is refused: the half was discarded
        with pytest.raises(ConflictError):
            await end(node, result, COMMIT)
        c = producer.client
        resp = await c.invoke(RemotingCommand.request(RequestCode.TXN_LIST, {"state": "discarded"}),
                              TIMEOUT)
        [row] = orjson.loads(resp.body)
        assert row["id"] == "U1" and row["state"] == "discarded" and row["checks"] == 3
        assert row["topic"] == "TxT" and row["producer_group"] == GROUP
        resp = await c.invoke(RemotingCommand.request(RequestCode.TXN_LIST, {}), TIMEOUT)
        assert orjson.loads(resp.body) == []  # default: pending only
        # operator resume (by offsetMsgId): pending again, counts reset, checked again
        resp = await c.invoke(RemotingCommand.request(RequestCode.TXN_DECIDE, {
            "id": result.msg_id, "decision": "resume", "operator": "alice"}), TIMEOUT)
        assert resp.code == ResponseCode.SUCCESS, resp.remark
        assert orjson.loads(resp.body)["state"] == "pending"
        assert node.tx.entry(phys).checks == 0
        producer.answer = COMMIT
        node.clock.advance(10)
        assert (await node.tx.check_now()).sent == 1
        await eventually(lambda: node.tx.state_of(phys) is HalfState.COMMITTED)
        assert [m.body for m in visible(node)] == [b"hanging"]
        snap = node.metrics.snapshot()
        assert snap["tx_discards_total"] == "1" and snap["tx_resumes_total"] == "1"
    finally:
        await producer.close()


async def test_operator_decisions_and_show(node) -> None:
    producer = await Producer(node).start()
    try:
        c = producer.client
        a = await prepare(node, uniq="OPA", body=b"by-operator")
        b = await prepare(node, uniq="OPB")
        resp = await c.invoke(RemotingCommand.request(RequestCode.TXN_SHOW, {"id": "OPA"}), TIMEOUT)
        doc = orjson.loads(resp.body)
        assert doc["commit_log_offset"] == a.physical_offset and doc["body_size"] == 11
        assert doc["properties"]["KEYS"] == "K1" and doc["state"] == "pending"
        resp = await c.invoke(RemotingCommand.request(RequestCode.TXN_SHOW, {"id": b.msg_id}), TIMEOUT)
        assert orjson.loads(resp.body)["id"] == "OPB"
        resp = await c.invoke(RemotingCommand.request(RequestCode.TXN_SHOW, {"id": "NOPE"}), TIMEOUT)
        assert resp.code == ResponseCode.QUERY_NOT_FOUND and resp.remark == "no transaction NOPE"
        resp = await c.invoke(RemotingCommand.request(RequestCode.TXN_DECIDE, {
            "id": "OPA", "decision": "commit", "operator": "bob"}), TIMEOUT)
        assert resp.code == ResponseCode.SUCCESS
        assert orjson.loads(resp.body)["outcome"] == "apply"
        resp = await c.invoke(RemotingCommand.request(RequestCode.TXN_DECIDE, {
            "id": "OPB", "decision": "rollback", "operator": "bob"}), TIMEOUT)
        assert resp.code == ResponseCode.SUCCESS
        resp = await c.invoke(RemotingCommand.request(RequestCode.TXN_DECIDE, {
            "id": a.msg_id, "decision": "rollback", "operator": "bob"}), TIMEOUT)
        assert resp.code == ResponseCode.TRANSACTION_FAILED
        resp = await c.invoke(RemotingCommand.request(RequestCode.TXN_DECIDE, {
            "id": "OPA", "decision": "explode", "operator": "bob"}), TIMEOUT)
        assert resp.code == ResponseCode.SYSTEM_ERROR
        resp = await c.invoke(RemotingCommand.request(RequestCode.RESUME_CHECK_HALF_MESSAGE,
                                                      {"msgId": "UNKNOWN"}), TIMEOUT)
        assert resp.code == ResponseCode.SYSTEM_ERROR
        assert [m.body for m in visible(node)] == [b"by-operator"]
        ops = op_records(node)
        assert [o.properties.get("TXB_OPERATOR") for o in ops] == ["bob", "bob"]
        assert node.metrics.snapshot()["tx_commits_total_operator"] == "1"
    finally:
        await producer.close()


async def test_pass_cost_follows_pending_not_history(node, monkeypatch) -> None:
    for i in range(30):
        r = await prepare(node, uniq=f"H{i}")
        await end(node, r, ROLLBACK if i % 2 else COMMIT)
    producer = await Producer(node).start()
    try:
        await prepare(node, producer.conn, uniq="LIVE")
        node.clock.advance(10)
        # Count what the pass reads from the store: the real methods still run.
        reads: list[str] = []
        for name in ("read", "read_raw", "get"):
            real = getattr(node.store, name)
            monkeypatch.setattr(node.store, name,
                                lambda *a, _real=real, _name=name, **k: (reads.append(_name), _real(*a, **k))[1])
        report = await node.tx.check_now()
        assert report.pending == 1 and report.due == 1 and report.sent == 1
        # Only the one pending half is read back (for the check's body): not the 30 decided
        # halves, their op records or the half queue.
        assert "get" not in reads and reads.count("read") == 1, reads
        await producer.wait_checks(1)
    finally:
        await producer.close()


async def test_periodic_check_service_runs_on_its_interval(tmp_path) -> None:
    cfg = tx_config(tmp_path / "data", transaction_check_interval=0.05, transaction_timeout=0.0)
    node = await open_node(cfg, ManualClock())
    producer = await Producer(node, answer=ROLLBACK).start()
    try:
        result = await prepare(node, conn=producer.conn)
        await producer.wait_checks(1)  # no check_now(): the service's own task sent it
        await eventually(lambda: node.tx.state_of(result.physical_offset) is HalfState.ROLLED_BACK)
        assert int(node.metrics.snapshot()["tx_check_passes_total"]) >= 1
    finally:
        await producer.close()
        await node.close()


async def test_many_check_counts_are_split_to_fit_the_message_limit(tmp_path) -> None:
    cfg = tx_config(tmp_path / "data", max_message_size=1024, check_concurrency=16)
    node = await open_node(cfg, ManualClock())
    producer = await Producer(node).start()
    try:
        n = 300  # ~300 x 4-7 bytes of counts: more than half the 1 KiB limit
        for i in range(n):
            await prepare(node, conn=producer.conn, uniq=f"N{i}", body=b"b")
        node.clock.advance(10)
        assert (await node.tx.check_now()).sent == n
        records = [o for o in op_records(node) if o.tags == "c"]
        assert len(records) > 1 and all(len(o.body) <= 1024 for o in records)
        await producer.wait_checks(n)
    finally:
        await producer.close()
        await node.close()
    node = await open_node(cfg, ManualClock())
    try:
        assert node.tx.recovered_from_snapshot
        assert {e.checks for e in node.tx.pending_entries()} == {1}
    finally:
        await node.close()
    (cfg.data_path / "txstate.snapshot").unlink()
    node = await open_node(cfg, ManualClock())
    try:
        assert not node.tx.recovered_from_snapshot
        assert {e.checks for e in node.tx.pending_entries()} == {1}  # from the c records
        assert node.tx.pending_count() == n
    finally:
        await node.close()


async def test_store_refusing_writes_loses_no_decision(tmp_path) -> None:
    usage = {"used": 10}
    node = await open_node(tx_config(tmp_path / "data"), ManualClock(),
                           disk_usage=lambda path: (100, usage["used"], 100 - usage["used"]))
    try:
        a = await prepare(node, uniq="A", body=b"a")
        b = await prepare(node, uniq="B", body=b"b")
        usage["used"] = 99  # the disk fills up
        assert node.store.recheck_disk()
        refused = await node.tx.prepare(half_msg(uniq="C"), None)
        assert refused.status.name == "SERVICE_NOT_AVAILABLE"
        for result, decision in ((a, COMMIT), (b, ROLLBACK)):
            with pytest.raises(TransactionError) as err:
                await end(node, result, decision)
            assert err.value.code == ResponseCode.SYSTEM_ERROR and "store refused" in err.value.remark
            assert node.tx.state_of(result.physical_offset) is HalfState.PENDING
        assert node.tx.pending_count() == 2 and visible(node) == []
        usage["used"] = 10  # space again: the same decisions now apply
        assert node.store.recheck_disk() == ""
        assert await end(node, a, COMMIT) is Outcome.APPLY
        assert await end(node, b, ROLLBACK) is Outcome.APPLY
        assert [m.body for m in visible(node)] == [b"a"]
    finally:
        await node.close()


async def test_half_reaching_retention_age_is_discarded_not_lost(tmp_path) -> None:
    node = await open_node(tx_config(tmp_path / "data", file_reserved_time=100.0), ManualClock())
    producer = await Producer(node).start()
    try:
        result = await prepare(node, conn=producer.conn, body=b"old")
        node.clock.advance(101)
        report = await node.tx.check_now()
        assert report.discarded == 1 and report.sent == 0
        assert node.tx.state_of(result.physical_offset) is HalfState.DISCARDED
        [copy] = visible(node, CHECK_MAX_TIME_TOPIC, 0)
        assert copy.body == b"old" and copy.properties["TRANSACTION_CHECK_TIMES"] == "0"
    finally:
        await producer.close()
        await node.close()


async def test_half_whose_segment_was_deleted_leaves_the_index(tmp_path) -> None:
    # e.g. the broker was down past retention: the halves' segment is gone
    node = await open_node(tx_config(tmp_path / "data", file_reserved_time=100.0), ManualClock())
    producer = await Producer(node).start()
    try:
        checked = await prepare(node, conn=producer.conn, uniq="A", body=b"gone")
        aged = await prepare(node, uniq="B", body=b"gone too", PGROUP="PG_NOBODY")  # never checked
        for _ in range(20):  # > 1 MiB: the halves' segment is closed
            await node.store.put(Message(topic="Filler", queue_id=0, body=bytes(60_000)))
        assert await node.store.delete_expired(now=node.clock() + 10**6) >= 1
        assert node.store.read(checked.physical_offset) is None
        node.clock.advance(10)
        report = await node.tx.check_now()
        assert (report.failed, report.sent, report.no_producer) == (1, 0, 1)
        assert [e.uniq for e in node.tx.pending_entries()] == ["B"]
        node.clock.advance(100)  # B reaches retention age: discarding finds it gone
        report = await node.tx.check_now()
        assert report.discarded == 0 and node.tx.pending_count() == 0
        assert node.tx.state_of(aged.physical_offset) is None
        assert producer.checks == []
    finally:
        await producer.close()
        await node.close()


async def test_decision_beyond_the_history_bound_is_shown_by_offset_msg_id_only(tmp_path) -> None:
    node = await open_node(tx_config(tmp_path / "data", transaction_history_size=1), ManualClock())
    try:
        old, new = await prepare(node, uniq="OLD"), await prepare(node, uniq="NEW")
        await end(node, old, COMMIT)
        await end(node, new, ROLLBACK)  # evicts OLD's entry
        assert node.tx.show("OLD") is None
        shown = node.tx.show(old.msg_id)  # the one-byte state outlives the history entry
        assert (shown["state"], shown["source"], shown["decided_at"]) == ("committed", "unknown", None)
        assert (node.tx.show("NEW")["state"], node.tx.show("NEW")["source"]) == ("rolled_back", "producer")
        with pytest.raises(TransactionError) as err:
            await node.tx.operator_decide("OLD", "commit", operator="ops")
        assert err.value.code == ResponseCode.QUERY_NOT_FOUND
        assert (await node.tx.operator_decide(old.msg_id, "commit", operator="ops"))["outcome"] == "duplicate"
    finally:
        await node.close()
