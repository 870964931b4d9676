"""Replays and tampering on the controller link, by someone on the path who holds no secret:
a relay of real sockets between a broker and a real controller (in-process, or broker
processes killed with SIGKILL) records what crosses it and sends it again.

Each attack worked against RocketMQ's value-only request signature, which the link used
before the cluster envelope: two masters, a dead master kept alive, a heartbeat's fields
rewritten under a signature that still verified.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest
from support.cluster import InProcessCluster, send_request, start_namesrv
from support.remoting_relay import FrameRelay, Pair
from support.waiting import eventually

from txbroker.bench.chaos.process import free_port
from txbroker.cluster.controller_link import (
    ControllerError,
    ControllerLink,
    ReplicaState,
)
from txbroker.config import BrokerConfig
from txbroker.controller import ControllerConfig, ControllerProcess
from txbroker.remoting.client import RemotingClient
from txbroker.remoting.codec import decode_frame
from txbroker.remoting.codes import RequestCode, ResponseCode
from txbroker.remoting.command import RemotingCommand

SECRET = "cluster-secret-1"
LEASE = 1.0


@pytest.fixture
async def controller(tmp_path: Path):
    ctl = ControllerProcess(ControllerConfig(listen_host="127.0.0.1", port=0, lease=LEASE,
                                             data_dir=str(tmp_path / "controller"),
                                             cluster_secret=SECRET))
    await ctl.start()
    try:
        yield ctl
    finally:
        await ctl.stop()


@pytest.fixture
async def relay_to(controller: ControllerProcess):
    made: list[FrameRelay] = []

    async def make(tap) -> str:
        relay = FrameRelay(controller.addr, tap)
        made.append(relay)
        return await relay.start()

    try:
        yield make
    finally:
        for relay in made:
            await relay.close()


def _is_heartbeat(cmd: RemotingCommand, to_target: bool) -> bool:
    return to_target and not cmd.is_response and cmd.code == RequestCode.BROKER_HEARTBEAT


class AnswerReplay:
    """Forwards everything and records the controller's last SUCCESS answer to a heartbeat;
    once ``replaying``, forwards nothing either way (the master is cut off from the
    controller) and answers each heartbeat itself with that answer, under the new opaque."""

    def __init__(self) -> None:
        self.replaying = False
        self.recorded: bytes | None = None
        self.replayed = 0
        self._asked: set[int] = set()

    def __call__(self, cmd: RemotingCommand, frame: bytes, to_target: bool, pair: Pair) -> bool:
        if self.replaying:
            if _is_heartbeat(cmd, to_target) and self.recorded is not None:
                answer = decode_frame(self.recorded)
                answer.opaque = cmd.opaque
                pair.to_client(answer)
                self.replayed += 1
            return False
        if _is_heartbeat(cmd, to_target):
            self._asked.add(cmd.opaque)
        elif not to_target and cmd.is_response and cmd.opaque in self._asked:
            self._asked.discard(cmd.opaque)
            if cmd.code == ResponseCode.SUCCESS:
                self.recorded = frame
        return True


@pytest.mark.slow
async def test_a_recorded_heartbeat_answer_does_not_keep_a_cut_off_master_writing(
        broker_config: BrokerConfig, tmp_path: Path, controller: ControllerProcess,
        relay_to) -> None:
    """The relay cuts the master off from the controller and answers its heartbeats with a
    recorded SUCCESS.  The controller promotes the slave after one lease; by then the old
    master must refuse writes, or the group has two masters."""
    tap = AnswerReplay()
    addr_a = await relay_to(tap)
    base = broker_config.replace(controller_lease=LEASE, controller_heartbeat_interval=0.2,
                                 metadata_sync_interval=0.2, cluster_secret=SECRET)
    async with InProcessCluster(base, tmp_path) as c:
        await c.namesrv()
        a = await c.broker("broker-a", controller_addr=addr_a)
        b = await c.broker("broker-a", broker_id=1, controller_addr=controller.addr)
        await eventually(lambda: a.roles.sync_state_set == {0, 1} and tap.recorded is not None,
                         timeout=15)
        client = RemotingClient(a.broker_addr)
        try:
            assert (await client.invoke(send_request("Split", b"before"), 5)).code == ResponseCode.SUCCESS
            tap.replaying = True
            await eventually(lambda: b.roles.is_master, timeout=15, msg="the slave is promoted")
            await eventually(lambda: tap.replayed >= 3, timeout=5)
            resp = await client.invoke(send_request("Split", b"to the old master"), 5)
            assert resp.code == ResponseCode.SERVICE_NOT_AVAILABLE, \
                f"two masters: the old one still acknowledges writes ({resp.code} {resp.remark})"
            assert "lease" in (resp.remark or "")
            assert a.roles.link is not None and not a.roles.link.lease_valid()
        finally:
            await client.close()


class HeartbeatRecorder:
    """Forwards everything; keeps the broker's last heartbeat request as it crossed."""

    def __init__(self) -> None:
        self.last: bytes | None = None

    def __call__(self, cmd: RemotingCommand, frame: bytes, to_target: bool, pair: Pair) -> bool:
        if _is_heartbeat(cmd, to_target):
            self.last = frame
        return True


@pytest.mark.slow
async def test_a_heartbeat_replayed_after_the_master_is_killed_does_not_stop_the_failover(
        broker_process, tmp_path: Path, controller: ControllerProcess, relay_to) -> None:
    """Broker processes; the master's heartbeats cross a recording relay.  The master is
    killed (SIGKILL) and its last heartbeat is sent to the controller again and again: the
    controller must refuse it and promote the slave within a few leases."""
    tap = HeartbeatRecorder()
    addr_a = await relay_to(tap)
    ns = await start_namesrv()
    try:
        common = {"namesrv_addr": ns.addr, "namesrv_port": -1, "broker_name": "broker-a",
                  "broker_role": "ASYNC_MASTER", "controller_lease": LEASE,
                  "controller_heartbeat_interval": 0.2, "cluster_secret": SECRET}
        first, _second = [await asyncio.to_thread(
            broker_process, tmp_path / f"a-{i}", broker_id=i, broker_port=free_port(),
            ha_port=free_port(), controller_addr=addr, **common)
            for i, addr in ((0, addr_a), (1, controller.addr))]

        def in_sync() -> bool:
            view = controller.state.replica_info("broker-a")
            return view.master_broker_id == 0 and view.sync_state_set == {0, 1}

        await eventually(lambda: "broker-a" in controller.state.groups() and in_sync(), timeout=20)
        await eventually(lambda: tap.last is not None, timeout=5)
        first.kill()
        killed = time.monotonic()
        recorded = tap.last
        assert recorded is not None
        codes: list[int] = []
        replayer = RemotingClient(controller.addr)

        async def replay() -> None:
            while True:
                try:
                    codes.append((await replayer.invoke(decode_frame(recorded), 2.0)).code)
                except (OSError, TimeoutError):
                    pass
                await asyncio.sleep(0.2)

        task = asyncio.create_task(replay())
        try:
            await eventually(lambda: controller.state.replica_info("broker-a").master_broker_id == 1,
                             timeout=4 * LEASE + 3,
                             msg=lambda: f"no failover {time.monotonic() - killed:.1f} s after the "
                                         f"kill; replayed heartbeats answered {codes}")
            assert codes and ResponseCode.SUCCESS not in codes, codes
            assert set(codes) == {ResponseCode.NO_PERMISSION}
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            await replayer.close()
    finally:
        await ns.stop()


class HeartbeatCapture:
    """Once ``capturing``, keeps every heartbeat request and forwards none of them."""

    def __init__(self) -> None:
        self.capturing = False
        self.frames: list[bytes] = []

    def __call__(self, cmd: RemotingCommand, frame: bytes, to_target: bool, pair: Pair) -> bool:
        if self.capturing and _is_heartbeat(cmd, to_target):
            self.frames.append(frame)
            return False
        return True


async def test_bytes_moved_between_two_fields_of_a_signed_heartbeat_are_refused(
        tmp_path: Path, controller: ControllerProcess, relay_to) -> None:
    """A broker's real heartbeat (epoch 11, a 3 s timeout), caught on the path; '1' moved
    from the end of ``epoch`` to the front of ``heartbeatTimeoutMills`` reads epoch 1 with a
    13 s timeout, and the values run together are the same bytes."""
    tap = HeartbeatCapture()
    addr = await relay_to(tap)
    config = BrokerConfig(controller_addr=addr, cluster_secret=SECRET, broker_id=0,
                          controller_lease=3.0)

    async def on_master(info) -> None:
        pass

    link = ControllerLink(config, broker_addr="127.0.0.1:10911", ha_addr="127.0.0.1:10912",
                          state=lambda: ReplicaState(epoch=11, max_offset=1234),
                          on_master=on_master, request_timeout=0.5)
    try:
        await link.register()
        await link.elect()  # master under epoch 1
        tap.capturing = True
        with pytest.raises(ControllerError):
            await link.heartbeat()  # caught by the relay: never answered
        heartbeat = decode_frame(tap.frames[0])
        ext = heartbeat.ext_fields
        assert (ext["epoch"], ext["heartbeatTimeoutMills"]) == ("11", "3000")
        moved = decode_frame(tap.frames[0])
        moved.ext_fields.update(epoch="1", heartbeatTimeoutMills="13000")

        before = controller.state.heartbeat_of("broker-a", 0)
        client = RemotingClient(controller.addr)
        try:
            resp = await client.invoke(moved, 3.0)
            beat = controller.state.heartbeat_of("broker-a", 0)
            assert beat is not None and beat.timeout != 13.0, \
                "the controller took a 13 s liveness timeout from a rewritten heartbeat"
            assert beat == before
            assert resp.code == ResponseCode.NO_PERMISSION, (resp.code, resp.remark)
            assert "does not match" in (resp.remark or "")
            # The heartbeat as the broker made it is obeyed, once.
            assert (await client.invoke(decode_frame(tap.frames[0]), 3.0)).code == ResponseCode.SUCCESS
            again = await client.invoke(decode_frame(tap.frames[0]), 3.0)
            assert again.code == ResponseCode.NO_PERMISSION and "nonce" in (again.remark or "")
        finally:
            await client.close()
    finally:
        await link.close()
