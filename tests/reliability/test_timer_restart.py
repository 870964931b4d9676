"""Timer messages across a broker SIGKILL and restart (a ``txbroker serve`` subprocess):
nothing pending is lost, a recall stays a recall, a timer due while the broker was down is
delivered once it is back, and transactional timers keep their decision: committed ones are
delivered at their time, a rolled-back one never, a half left undecided by the crash is
checked back after the restart and, once committed, delivered at its time, and a commit cut
between its timer record and its op record is recovered as committed and delivered once."""

from __future__ import annotations

import asyncio
import json
import sys
import textwrap
import time

import pytest
from support.waiting import eventually

from txbroker.broker import Broker
from txbroker.client import (
    Consumer,
    LocalTransactionState,
    Message,
    Producer,
    TransactionListener,
    TransactionProducer,
)
from txbroker.client.admin import AdminClient
from txbroker.config import BrokerConfig
from txbroker.service.transaction.state import HalfState

pytestmark = pytest.mark.slow

TOPIC = "TimerKill"


def now_ms() -> int:
    return int(time.time() * 1000)


class _Answer(TransactionListener):
    def __init__(self, local: LocalTransactionState, checked: LocalTransactionState) -> None:
        self.local, self.checked, self.checks = local, checked, 0

    async def execute_local_transaction(self, msg, arg):
        return self.local

    async def check_local_transaction(self, msg):
        self.checks += 1
        return self.checked


async def collect_keys(namesrv: str, group: str, want: int, quiet: float) -> list:
    """Messages of TOPIC until ``want`` came and then ``quiet`` seconds brought nothing more
    (bounded: 30 s in all)."""
    got = []
    consumer = Consumer(group, namesrv, from_where="first", long_poll_timeout=0.5)
    consumer.subscribe(TOPIC)
    deadline = time.monotonic() + 30
    async with consumer:
        while time.monotonic() < deadline:
            msg = await consumer.poll(quiet if len(got) >= want else 1.0)
            if msg is None and len(got) >= want:
                break
            if msg is not None:
                got.append(msg)
    return got


async def test_timers_survive_sigkill_and_restart(broker_process) -> None:
    proc = broker_process()
    async with AdminClient(proc.namesrv_addr) as admin:
        await admin.create_topic(TOPIC, 2)
    start = now_ms()
    early, late = start + 3000, start + 9000
    async with Producer("PG_TK", proc.namesrv_addr) as producer:
        sent = {}
        for i in range(10):  # due while the broker is down
            sent[f"e{i}"] = await producer.send(Message(TOPIC, b"e", keys=f"e{i}",
                                                        deliver_time_ms=early))
        for i in range(10):  # due after the restart
            sent[f"l{i}"] = await producer.send(Message(TOPIC, b"l", keys=f"l{i}",
                                                        deliver_time_ms=late))
        for key in ("e0", "l0"):
            await producer.recall(TOPIC, sent[key].recall_handle)
    commit = TransactionProducer("PG_TK_TX", proc.namesrv_addr, listener=_Answer(
        LocalTransactionState.COMMIT_MESSAGE, LocalTransactionState.COMMIT_MESSAGE))
    rollback = TransactionProducer("PG_TK_RB", proc.namesrv_addr, listener=_Answer(
        LocalTransactionState.ROLLBACK_MESSAGE, LocalTransactionState.ROLLBACK_MESSAGE))
    undecided = TransactionProducer("PG_TK_UN", proc.namesrv_addr, listener=_Answer(
        LocalTransactionState.UNKNOW, LocalTransactionState.UNKNOW))
    async with commit, rollback, undecided:
        await commit.send_message_in_transaction(Message(TOPIC, b"c", keys="tx-commit",
                                                         deliver_time_ms=late))
        await rollback.send_message_in_transaction(Message(TOPIC, b"r", keys="tx-rollback",
                                                           deliver_time_ms=early))
        await undecided.send_message_in_transaction(Message(TOPIC, b"u", keys="tx-checked",
                                                            deliver_time_ms=late))
    proc.kill()
    await asyncio.sleep(max(0.0, (early + 500 - now_ms()) / 1000))  # the early ones fall due
    proc.start()
    checker = _Answer(LocalTransactionState.UNKNOW, LocalTransactionState.COMMIT_MESSAGE)
    async with TransactionProducer("PG_TK_UN", proc.namesrv_addr, listener=checker):
        expected = {f"e{i}" for i in range(1, 10)} | {f"l{i}" for i in range(1, 10)} \
            | {"tx-commit", "tx-checked"}
        got = await collect_keys(proc.namesrv_addr, "CG_TK", len(expected), quiet=1.0)
    keys = [m.keys for m in got]
    assert sorted(keys) == sorted(expected)  # nothing lost, none twice, no recalled, no rollback
    assert checker.checks >= 1
    for m in got:
        due = early if m.keys.startswith("e") else late
        assert m.store_timestamp >= due, (m.keys, m.store_timestamp - due)
    assert "Traceback" not in proc.log_tail()


async def test_kill_during_deliveries_loses_none(broker_process) -> None:
    """Timers falling due one after another while the broker is killed in their midst: after
    the restart every one is delivered (at least once: a crash may repeat a delivery)."""
    proc = broker_process()
    async with AdminClient(proc.namesrv_addr) as admin:
        await admin.create_topic(TOPIC, 2)
    start = now_ms() + 1000
    keys = [f"k{i}" for i in range(60)]
    async with Producer("PG_TK2", proc.namesrv_addr) as producer:
        for i, key in enumerate(keys):  # one every 50 ms over 3 s
            await producer.send(Message(TOPIC, b"k", keys=key, deliver_time_ms=start + 50 * i))
    await asyncio.sleep(max(0.0, (start + 1500 - now_ms()) / 1000))
    proc.kill()
    proc.start()
    got = await collect_keys(proc.namesrv_addr, "CG_TK2", len(keys), quiet=1.0)
    assert {m.keys for m in got} == set(keys)
    assert "Traceback" not in proc.log_tail()


#: The child: a broker whose commit of a transactional timer dies (SIGKILL) right after the
#: final message, here the timer record, is stored and before its op record.
CHILD = textwrap.dedent("""
    import asyncio, json, os, signal, sys
    from txbroker.broker import Broker
    from txbroker.config import BrokerConfig
    from txbroker.store.record import Message

    async def main():
        b = Broker(BrokerConfig(data_dir=sys.argv[1], listen_host="127.0.0.1", broker_port=0,
                                namesrv_port=-1, metrics_port=-1, segment_size=1 << 20,
                                max_message_size=256 * 1024))
        await b.start()
        await b.topics.get_or_create("TxTimerCrash", queue_nums=1)

        async def put_commit_then_die(final, op):
            await b.store.put(final)
            os.kill(os.getpid(), signal.SIGKILL)

        b.tx.bridge.put_commit = put_commit_then_die
        await b.store.put(Message("TxTimerCrash", 0, b"before"))  # the half is not at offset 0
        half = Message("TxTimerCrash", 0, b"once", sys_flag=4, properties={
            "PGROUP": "PG_CRASH", "TRAN_MSG": "true", "UNIQ_KEY": "U-CRASH",
            "TIMER_DELIVER_MS": sys.argv[2]})
        res = await b.tx.prepare(half, None)
        print(json.dumps({"phys": res.physical_offset}), flush=True)
        await b.tx.end_transaction(commit_log_offset=res.physical_offset,
                                   tran_state_table_offset=res.queue_offset,
                                   producer_group="PG_CRASH", commit_or_rollback=8)
        print("not reached", flush=True)

    asyncio.run(main())
""")


async def test_crash_between_a_transactional_timer_and_its_op_record(tmp_path) -> None:
    """Transaction recovery finds the commit through the timer record (it keeps the commit
    flag and the half's offset): the half is not checked or committed again, and the timer is
    delivered once, at its time."""
    data = tmp_path / "data"
    due = now_ms() + 4000
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", CHILD, str(data), str(due), stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == -9, err.decode()[-2000:]
    lines = out.decode().splitlines()
    assert "not reached" not in lines
    phys = json.loads(lines[0])["phys"]
    b = Broker(BrokerConfig(data_dir=str(data), listen_host="127.0.0.1", broker_port=0,
                            namesrv_port=-1, metrics_port=-1, segment_size=1 << 20,
                            max_message_size=256 * 1024,
                            transaction_check_interval=0.2, transaction_timeout=0.5))
    await b.start()
    try:
        assert b.tx.state_of(phys) is HalfState.COMMITTED and b.tx.pending_count() == 0
        assert b.timer.pending == 1
        assert b.store.max_offset("TxTimerCrash", 0) == 1  # "before" only: not before its time
        await eventually(lambda: b.store.max_offset("TxTimerCrash", 0) == 2, timeout=20,
                         msg="the committed timer delivered")
        [_, m] = b.store.get("TxTimerCrash", 0, 0, 10).messages()
        assert m.body == b"once" and m.store_timestamp >= due
        await asyncio.sleep(1.0)  # several check intervals: no check, no second delivery
        assert b.store.max_offset("TxTimerCrash", 0) == 2
    finally:
        await b.stop()
