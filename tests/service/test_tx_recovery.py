"""Transaction state across restarts: clean restarts and a SIGKILL between a commit's final
message and its op record (the crash is real: a child process kills itself at that point)."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest
from support.clock import ManualClock
from support.txnode import (
    COMMIT,
    ROLLBACK,
    Producer,
    end,
    op_records,
    open_node,
    prepare,
    tx_config,
    visible,
)
from support.waiting import eventually

from txbroker.service.transaction.state import ConflictError, HalfState, Outcome
from txbroker.store.record import CHECK_MAX_TIME_TOPIC, OP_HALF_TOPIC, Message

REPO_ROOT = Path(__file__).resolve().parents[2]

#: The child: prepare a half, then commit it through a bridge that kills the process right
#: after the final message is stored (before the op record).  It never closes the store.
CHILD = textwrap.dedent("""
    import asyncio, json, os, signal, sys, time
    sys.path.insert(0, sys.argv[2])
    from support.clock import ManualClock
    from support.txnode import open_node, prepare, tx_config, COMMIT, end
    from txbroker.service.transaction.bridge import TransactionalMessageBridge

    class CrashAfterFinalMessage(TransactionalMessageBridge):
        async def put_commit(self, final, op):
            await self.store.put(final)
            os.kill(os.getpid(), signal.SIGKILL)

    async def main():
        node = await open_node(tx_config(sys.argv[1]), ManualClock(), bridge=CrashAfterFinalMessage)
        result = await prepare(node, body=b"exactly-once")
        print(json.dumps({"phys": result.physical_offset, "qo": result.queue_offset}), flush=True)
        await end(node, result, COMMIT)
        print("not reached", flush=True)

    asyncio.run(main())
""")


def test_crash_between_final_message_and_op_record(tmp_path) -> None:
    data = tmp_path / "data"

    async def history():
        # earlier transactions, then a clean stop: the child starts from the snapshot
        node = await open_node(tx_config(data), ManualClock())
        try:
            await end(node, await prepare(node, uniq="H1", body=b"h1"), COMMIT)
            await end(node, await prepare(node, uniq="H2", body=b"h2"), ROLLBACK)
            return await prepare(node, uniq="H3", body=b"h3")
        finally:
            await node.close()

    pending = asyncio.run(history())
    assert (data / "txstate.snapshot").exists()
    proc = subprocess.run([sys.executable, "-c", CHILD, str(data), str(Path(__file__).parents[1])],
                          cwd=REPO_ROOT, capture_output=True, text=True, timeout=60, check=False,
                          env={**os.environ, "PYTHONPATH": os.pathsep.join(
                              filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))})
    assert proc.returncode == -9, proc.stderr
    lines = proc.stdout.splitlines()
    assert "not reached" not in lines
    half = json.loads(lines[0])

    async def after_restart() -> None:
        node = await open_node(tx_config(data), ManualClock())
        try:
            assert not node.tx.recovered_from_snapshot  # the child consumed it: full replay
            # the final message survived the kill, the op record was never written...
            assert [m.body for m in visible(node)] == [b"h1", b"exactly-once"]
            # ...and recovery saw the commit through preparedTransactionOffset
            assert node.tx.state_of(half["phys"]) is HalfState.COMMITTED
            # the history before the snapshot is intact
            assert [e.uniq for e in node.tx.pending_entries()] == ["H3"]
            assert node.tx.state_of(pending.physical_offset) is HalfState.PENDING
            # who committed died with the op record: the history says so instead of guessing
            shown = node.tx.show("U1")
            assert (shown["state"], shown["source"], shown["operator"]) == ("committed", "unknown", None)
            # ...and so did the count of check-backs: left out, not shown as 0
            assert "checks" not in shown
            assert node.tx.show("H1")["checks"] == 0  # the producer decided before any check
            assert node.tx.show("H1")["source"] == node.tx.show("H2")["source"] == "producer"
            # start() wrote the missing op record
            ops = op_records(node)
            assert len(ops) == 3
            assert ops[-1].tags == "d" and ops[-1].body == str(half["qo"]).encode()
            fake = type("R", (), {"physical_offset": half["phys"], "queue_offset": half["qo"]})
            assert await end(node, fake, COMMIT) is Outcome.DUPLICATE
            assert await end(node, fake, COMMIT, from_check=True) is Outcome.DUPLICATE
            with pytest.raises(ConflictError):
                await end(node, fake, ROLLBACK)
            assert len(visible(node)) == 2 and len(op_records(node)) == 3
        finally:
            await node.close()

    asyncio.run(after_restart())


@pytest.mark.parametrize("snapshot", [True, False], ids=["snapshot", "full-replay"])
async def test_restart_rebuilds_pending_resolved_counts_and_discards(tmp_path, snapshot) -> None:
    data = tmp_path / "data"
    clock = ManualClock()
    node = await open_node(tx_config(data), clock)
    producer = await Producer(node).start()
    try:
        committed = await prepare(node, uniq="C", body=b"c")
        rolled = await prepare(node, uniq="R", body=b"r")
        await end(node, committed, COMMIT)
        await end(node, rolled, ROLLBACK)
        discarded = await prepare(node, conn=producer.conn, uniq="D", body=b"d")
        resumed = await prepare(node, conn=producer.conn, uniq="S", body=b"s")
        for _ in range(4):  # 3 checks each, then the discard
            clock.advance(10)
            await node.tx.check_now()
        assert node.tx.state_of(discarded.physical_offset) is HalfState.DISCARDED
        assert node.tx.state_of(resumed.physical_offset) is HalfState.DISCARDED
        discarded_at = node.tx.show("D")["decided_at"]
        await node.tx.operator_decide("S", "resume", operator="carol")
        checked = await prepare(node, conn=producer.conn, uniq="P", body=b"p")
        for _ in range(2):  # P and the resumed S are checked twice
            clock.advance(10)
            assert (await node.tx.check_now()).sent == 2
    finally:
        await producer.close()
        await node.close()

    assert (data / "txstate.snapshot").exists()  # written by the clean close
    if not snapshot:
        (data / "txstate.snapshot").unlink()
    node = await open_node(tx_config(data), clock)
    try:
        tx = node.tx
        assert tx.recovered_from_snapshot is snapshot
        assert not (data / "txstate.snapshot").exists()  # used once
        assert tx.state_of(committed.physical_offset) is HalfState.COMMITTED
        assert tx.state_of(rolled.physical_offset) is HalfState.ROLLED_BACK
        assert tx.state_of(checked.physical_offset) is HalfState.PENDING
        assert tx.entry(checked.physical_offset).checks == 2
        assert tx.state_of(discarded.physical_offset) is HalfState.DISCARDED
        assert tx.entry(discarded.physical_offset).checks == 3
        assert tx.state_of(resumed.physical_offset) is HalfState.PENDING
        assert tx.entry(resumed.physical_offset).checks == 2
        assert tx.pending_count() == 2 and tx.discarded_count() == 1
        assert node.metrics.snapshot()["tx_pending"] == "2"
        # decisions after the restart respect what happened before it
        end_of_log = node.store.max_physical_offset
        assert await end(node, committed, COMMIT) is Outcome.DUPLICATE
        assert await end(node, rolled, ROLLBACK) is Outcome.DUPLICATE
        with pytest.raises(ConflictError):
            await end(node, committed, ROLLBACK)
        with pytest.raises(ConflictError):
            await end(node, discarded, COMMIT)
        assert node.store.max_physical_offset == end_of_log
        rows = tx.list_halves("all")
        assert [r["id"] for r in rows] == ["D", "S", "P"]
        # the decision history came back with them, by transaction id
        shown = {i: tx.show(i) for i in "CRDSP"}
        assert [(shown[i]["state"], shown[i].get("source")) for i in "CRDSP"] == [
            ("committed", "producer"), ("rolled_back", "producer"), ("discarded", "check"),
            ("pending", None), ("pending", None)]
        assert shown["D"]["decided_at"] == discarded_at
        # the recovered halves are still checked (no sending connection after a restart:
        # the group's live connection is used)
        producer = await Producer(node, answer=COMMIT).start()
        try:
            clock.advance(10)
            report = await tx.check_now()
            assert report.sent == 2 and report.discarded == 0
            await producer.wait_checks(2)
            assert sorted(c.ext_fields["msgId"] for c in producer.checks) == ["P", "S"]
            await eventually(lambda: tx.pending_count() == 0)
        finally:
            await producer.close()
        assert sorted(m.body for m in visible(node)) == [b"c", b"p", b"s"]
        # a decided half shows how many check-backs it took (P: 2 before the restart, the
        # answered one after; S: 2 since its resume, then the answered one)
        counts = {i: tx.show(i).get("checks") for i in "CRDPS"}
        assert counts == {"C": 0, "R": 0, "D": 3, "P": 3, "S": 3}, counts
    finally:
        await node.close()
    # the counts of decided halves survive a restart: in the snapshot, or in the op records
    if not snapshot:
        (data / "txstate.snapshot").unlink()
    node = await open_node(tx_config(data), clock)
    try:
        assert node.tx.recovered_from_snapshot is snapshot
        assert {i: node.tx.show(i).get("checks") for i in "CRDPS"} == counts
    finally:
        await node.close()


@pytest.mark.parametrize("content", ["garbage", "ahead"])
async def test_unusable_snapshot_falls_back_to_replay(tmp_path, content) -> None:
    data = tmp_path / "data"
    node = await open_node(tx_config(data), ManualClock())
    try:
        committed = await prepare(node, uniq="C")
        await end(node, committed, COMMIT)
        await prepare(node, uniq="P")
    finally:
        await node.close()
    snap = data / "txstate.snapshot"
    if content == "garbage":
        snap.write_bytes(b"TXBSNAP1\x00\x00\x00\x05{oops")
    else:  # a snapshot of a store that has more than this one (e.g. a lost tail)
        other = tmp_path / "other"
        big = await open_node(tx_config(other), ManualClock())
        try:
            for i in range(3):
                await end(big, await prepare(big, uniq=f"B{i}"), ROLLBACK)
        finally:
            await big.close()
        snap.write_bytes((other / "txstate.snapshot").read_bytes())
    node = await open_node(tx_config(data), ManualClock())
    try:
        assert not node.tx.recovered_from_snapshot and not snap.exists()
        assert node.tx.state_of(committed.physical_offset) is HalfState.COMMITTED
        assert [e.uniq for e in node.tx.pending_entries()] == ["P"]
    finally:
        await node.close()


async def test_junk_op_records_do_not_disturb_recovery(tmp_path) -> None:
    data = tmp_path / "data"
    node = await open_node(tx_config(data), ManualClock())
    try:
        committed = await prepare(node, uniq="C")
        await end(node, committed, COMMIT)
        pending = await prepare(node, uniq="P")
        for tag, body in (("d", b"abc"), ("c", b"x:y,1:,:2"), ("r", b"-"), ("zz", b"0"),
                          ("d", "\u00b2".encode())):
            await node.store.put(Message(topic=OP_HALF_TOPIC, queue_id=0, body=body,
                                         properties={"TAGS": tag}))
        await node.store.put(Message(topic=CHECK_MAX_TIME_TOPIC, queue_id=0, body=b"no offset"))
    finally:
        await node.close()
    (data / "txstate.snapshot").unlink()
    node = await open_node(tx_config(data), ManualClock())
    try:
        assert not node.tx.recovered_from_snapshot
        assert node.tx.state_of(committed.physical_offset) is HalfState.COMMITTED
        assert node.tx.state_of(pending.physical_offset) is HalfState.PENDING
        assert node.tx.entry(pending.physical_offset).checks == 0
    finally:
        await node.close()


async def test_clean_close_writes_the_snapshot_off_the_event_loop(tmp_path, monkeypatch) -> None:
    """The snapshot (tens of MB with a full decision history) is written, fsynced and renamed
    in the executor: the loop thread never waits on that disk write."""
    data = tmp_path / "data"
    node = await open_node(tx_config(data), ManualClock())
    done = await prepare(node, uniq="C", body=b"c")
    await end(node, done, COMMIT)
    await prepare(node, uniq="P", body=b"p")
    loop_thread = threading.get_ident()
    fsyncs: list[tuple[int, str]] = []
    real_fsync = os.fsync

    def recording_fsync(fd: int) -> None:
        fsyncs.append((threading.get_ident(), os.readlink(f"/proc/self/fd/{fd}")))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", recording_fsync)
    await node.close()
    snapshot_fsyncs = [thread for thread, name in fsyncs if name.endswith(".tmp")]
    assert snapshot_fsyncs and loop_thread not in snapshot_fsyncs, fsyncs
    node = await open_node(tx_config(data), ManualClock())
    try:
        assert node.tx.recovered_from_snapshot
        assert node.tx.pending_count() == 1 and node.tx.show("C")["state"] == "committed"
    finally:
        await node.close()
