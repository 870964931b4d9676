"""The transaction coordinator under cancellation: a request handler cancelled at any await
(a client that went away) leaves memory and the log agreeing, so a retry, the scan and a
recovery each place every record of a commit exactly once and a commit holds every batch that
was acknowledged.

Each test runs one coordinator call as a task on a store in sync flush mode (so every put
waits for the disk), cancels it after the k-th step of the event loop for k = 1, 2, ... until
the call finishes before the cancel, and after every cancel retries, scans and recovers."""

from __future__ import annotations

import asyncio
import contextlib
from functools import partial

import pytest

from tests.kafka.test_kafka_txn_coordinator import Clock, Env, T, batch, begin
from tests.support.store import store_config
from txbroker.remoting.kafka.errors import ErrorCode

E = ErrorCode
TID = "app-1"
#: Loop steps tried at most.  A sync-flush put takes a handful on an idle machine, but the
#: flush runs in a thread: while the disk or the cores are busy the loop turns many times
#: before it completes (60 was exceeded under a parallel test load).
MAX_STEPS = 600
#: Retries of a call answered CONCURRENT_TRANSACTIONS or COORDINATOR_NOT_AVAILABLE.
RETRIES = 200

pytestmark = pytest.mark.slow


def sync_env(tmp_path) -> Env:
    env = Env(tmp_path, Clock())
    env.config = store_config(tmp_path, flush_mode="sync", kafka_transaction_max_timeout=900.0)
    return env


async def cancelled_after(call, steps: int) -> bool:
    """Run ``call()`` as a task and cancel it after ``steps`` loop steps; False when it
    finished first (nothing left to cancel)."""
    task = asyncio.ensure_future(call())
    for _ in range(steps):
        if task.done():
            break
        await asyncio.sleep(0)
    if task.done():
        task.result()
        return False
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    return True


async def until_answered(call) -> ErrorCode:
    """Retry ``call()`` (a client would) while it is answered with a retriable error, running
    the scan in between (it finishes decided commits)."""
    env_err = None
    for _ in range(RETRIES):
        env_err = await call()
        if env_err not in (E.CONCURRENT_TRANSACTIONS, E.COORDINATOR_NOT_AVAILABLE):
            return env_err
        await asyncio.sleep(0.01)
    raise AssertionError(f"still {env_err} after {RETRIES} retries")


async def scan_then_commit(c, pid: int, epoch: int) -> ErrorCode:
    await c.scan()
    return await c.end_txn(TID, pid, epoch, True, 0)


async def test_a_commit_cancelled_at_any_await_places_each_record_once(tmp_path):
    cancels = 0
    for k in range(1, MAX_STEPS):
        env = sync_env(tmp_path / str(k))
        c = await env.open()
        pid, epoch = await begin(c, partitions=[(T, 0), (T, 1)])
        b0, b1 = batch(pid, epoch, 0, [b"v0", b"v1", b"v2"]), batch(pid, epoch, 0, [b"w0"])
        assert await c.append_transactional(TID, T, 0, b0) is E.NONE
        assert await c.append_transactional(TID, T, 1, b1) is E.NONE
        if not await cancelled_after(partial(c.end_txn, TID, pid, epoch, True, 0), k):
            await env.close()
            break
        cancels += 1
        assert await until_answered(partial(scan_then_commit, c, pid, epoch)) is E.NONE, k
        want = ([b"v0", b"v1", b"v2"], [b"w0"])
        assert (env.bodies(0), env.bodies(1)) == want, k
        await c.scan()
        assert (env.bodies(0), env.bodies(1)) == want, k
        await env.close()
        await env.open()  # recovery finds nothing left to do
        assert (env.bodies(0), env.bodies(1)) == want, k
        assert env.coord.describe(TID).state == "CompleteCommit"
        await env.close()
    else:
        raise AssertionError(f"EndTxn still running after {MAX_STEPS} loop steps")
    assert cancels >= 3  # the commit has several awaits: each was hit


async def test_a_produce_cancelled_at_any_await_is_in_the_commit(tmp_path):
    cancels = 0
    for k in range(1, MAX_STEPS):
        env = sync_env(tmp_path / str(k))
        c = await env.open()
        pid, epoch = await begin(c, partitions=[(T, 0)])
        assert await c.append_transactional(TID, T, 0, batch(pid, epoch, 0, [b"a"])) is E.NONE
        b = batch(pid, epoch, 1, [b"b0", b"b1"])
        if not await cancelled_after(partial(c.append_transactional, TID, T, 0, b), k):
            await env.close()
            break
        cancels += 1
        # the client retries the batch whose answer it never got: stored once either way
        err, dup = c.check_batch(TID, T, 0, b)
        if err is E.NONE and dup is None:
            err = await c.append_transactional(TID, T, 0, b)
        assert err is E.NONE, k
        assert await c.append_transactional(TID, T, 0, batch(pid, epoch, 3, [b"c"])) is E.NONE
        assert await until_answered(partial(c.end_txn, TID, pid, epoch, True, 0)) is E.NONE
        assert env.bodies(0) == [b"a", b"b0", b"b1", b"c"], k
        await env.close()
        await env.open()
        assert env.bodies(0) == [b"a", b"b0", b"b1", b"c"], k
        await env.close()
    else:
        raise AssertionError(f"Produce still running after {MAX_STEPS} loop steps")
    assert cancels >= 1


async def test_offsets_cancelled_at_any_await_are_committed(tmp_path):
    for k in range(1, MAX_STEPS):
        env = sync_env(tmp_path / str(k))
        c = await env.open()
        pid, epoch = await begin(c, partitions=[(T, 0)])
        assert await c.add_offsets(TID, pid, epoch, "g", 0) is E.NONE
        if not await cancelled_after(
                partial(c.txn_offset_commit, TID, "g", pid, epoch, [(T, 0, 7)], 0), k):
            await env.close()
            break
        assert await until_answered(partial(c.end_txn, TID, pid, epoch, True, 0)) is E.NONE
        assert env.store.offsets.get("g", T, 0) == 7, k
        await env.close()
    else:
        raise AssertionError(f"TxnOffsetCommit still running after {MAX_STEPS} loop steps")


async def test_init_producer_id_cancelled_at_any_await_agrees_with_the_log(tmp_path):
    for k in range(1, MAX_STEPS):
        env = sync_env(tmp_path / str(k))
        c = await env.open()
        pid, epoch = await begin(c, partitions=[(T, 0)])
        assert await c.append_transactional(TID, T, 0, batch(pid, epoch, 0, [b"x"])) is E.NONE
        # a second instance fences the first: its open transaction is aborted, epoch bumped
        if not await cancelled_after(partial(c.init_producer_id, TID, 60000, -1, -1, 0), k):
            await env.close()
            break
        before = c.describe(TID)
        await env.close()
        c = await env.open()
        after = c.describe(TID)
        assert (after.state, after.producer_epoch) == (before.state, before.producer_epoch), k
        await env.close()
    else:
        raise AssertionError(f"InitProducerId still running after {MAX_STEPS} loop steps")
