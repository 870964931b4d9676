"""A broker stops even when a registration round is triggered at the moment it stops.

Python 3.11's ``asyncio.wait_for`` returns the awaited result, and drops the cancellation, when
both arrive in the same loop turn; the registration loop waited that way, so a role change or a
new topic that woke it just as the broker stopped left ``stop()`` waiting for a loop that never
ended (seen in the failover tests, where a promotion re-registers as the cluster stops)."""

from __future__ import annotations

import asyncio

from support.cluster import InProcessCluster


async def test_stop_right_after_a_triggered_round_ends(broker_config, tmp_path) -> None:
    async with InProcessCluster(broker_config, tmp_path) as c:
        await c.namesrv()
        b = await c.broker("broker-a")
        c.brokers.remove(b)
        assert b.registrar is not None
        b.registrar.trigger()
        await asyncio.sleep(0)  # the wake-up is delivered; the loop has not run yet
        stop = asyncio.create_task(b.stop())
        await asyncio.wait({stop}, timeout=10)  # not wait_for: its cancel would end the stop
        assert stop.done(), "the broker's stop did not end"
