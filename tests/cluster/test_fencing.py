"""Fencing a master: the lease on the write path, answers that must not be acknowledgements,
visibility bounded by the in-sync set, promotion order, and a clean stop.

Real brokers, name server and controller on 127.0.0.1 port 0, in-process.  A broker reaches
the controller through a relay of real sockets that the test can make silent (nothing
forwarded, nothing closed: a partition) or make drop chosen requests or their answers (lost
replies).
"""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path

import pytest
from support.cluster import InProcessCluster, send_request
from support.txnode import half_msg
from support.waiting import eventually

from txbroker.bench.chaos.faultproxy import FaultProxy
from txbroker.cluster.role_state import Role
from txbroker.config import BrokerConfig
from txbroker.controller import ControllerConfig, ControllerProcess
from txbroker.remoting.client import RemotingClient
from txbroker.remoting.codec import decode_frame, encode, frame_length
from txbroker.remoting.codes import RequestCode, ResponseCode
from txbroker.remoting.command import RemotingCommand
from txbroker.service.transaction.messages import final_message
from txbroker.store.epochs import FILE_NAME as EPOCH_FILE_NAME
from txbroker.store.epochs import EpochFile
from txbroker.store.record import OP_HALF_TOPIC, decode_offset_msg_id
from txbroker.store.results import Fence

pytestmark = pytest.mark.slow

LEASE = 1.0


class Relay:
    """A TCP relay to ``target`` whose faults the test switches on: ``silent`` forwards
    nothing either way and closes nothing; ``drop_requests`` loses requests with those codes;
    ``drop_answers_to`` loses the answers to requests with those codes; ``delay_requests``
    holds requests with those codes back so many seconds (the others pass meanwhile);
    ``ha_addr_seen_as`` replaces a master HA address in what reaches the broker (so it follows
    the master through a proxy)."""

    def __init__(self, target: str) -> None:
        self.host, port = target.rsplit(":", 1)
        self.port = int(port)
        self.silent = False
        self.drop_requests: set[int] = set()
        self.drop_answers_to: set[int] = set()
        self.delay_requests: dict[int, float] = {}
        self.ha_addr_seen_as: dict[str, str] = {}
        self._server: asyncio.base_events.Server | None = None
        self._tasks: set[asyncio.Task] = set()
        self._writers: list[asyncio.StreamWriter] = []

    async def start(self) -> str:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return f"127.0.0.1:{self._server.sockets[0].getsockname()[1]}"

    async def close(self) -> None:
        assert self._server is not None
        self._server.close()
        for w in self._writers:
            w.close()
        for t in list(self._tasks):
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection(self.host, self.port)
        self._writers += [writer, up_writer]
        lost: set[int] = set()  # opaques whose answers vanish
        for task in (self._pump(reader, up_writer, True, lost),
                     self._pump(up_reader, writer, False, lost)):
            t = asyncio.create_task(task)
            self._tasks.add(t)
            t.add_done_callback(self._tasks.discard)

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                    to_controller: bool, lost: set[int]) -> None:
        buf = bytearray()
        try:
            while data := await reader.read(65536):
                buf += data
                while (n := frame_length(buf)) is not None:
                    frame = bytes(buf[:n])
                    del buf[:n]
                    cmd = decode_frame(frame)
                    if not self._keep(cmd, to_controller, lost):
                        continue
                    seen_as = self.ha_addr_seen_as.get(cmd.ext_fields.get("masterHaAddress", ""))
                    if not to_controller and seen_as is not None:
                        cmd.ext_fields["masterHaAddress"] = seen_as
                        frame = encode(cmd)
                    delay = self.delay_requests.get(cmd.code) if to_controller else None
                    if delay:
                        asyncio.get_running_loop().call_later(delay, self._write, writer, frame)
                    else:
                        writer.write(frame)
        except (OSError, asyncio.CancelledError):
            pass
        finally:
            writer.close()

    @staticmethod
    def _write(writer: asyncio.StreamWriter, frame: bytes) -> None:
        if not writer.is_closing():
            writer.write(frame)

    def _keep(self, cmd: RemotingCommand, to_controller: bool, lost: set[int]) -> bool:
        if self.silent:
            return False
        if to_controller and not cmd.is_response:
            if cmd.code in self.drop_answers_to:
                lost.add(cmd.opaque)
            return cmd.code not in self.drop_requests
        if cmd.is_response and cmd.opaque in lost:
            lost.discard(cmd.opaque)
            return False
        return True


@pytest.fixture
async def controller(tmp_path: Path):
    ctl = ControllerProcess(ControllerConfig(listen_host="127.0.0.1", port=0,
                                             data_dir=str(tmp_path / "controller"), lease=LEASE))
    await ctl.start()
    try:
        yield ctl
    finally:
        await ctl.stop()


@pytest.fixture
async def relays(controller: ControllerProcess):
    made: list[Relay] = []

    async def relay() -> tuple[Relay, str]:
        r = Relay(controller.addr)
        made.append(r)
        return r, await r.start()

    try:
        yield relay
    finally:
        for r in made:
            await r.close()


def _base(broker_config: BrokerConfig) -> BrokerConfig:
    return broker_config.replace(controller_lease=LEASE, controller_heartbeat_interval=0.2,
                                 metadata_sync_interval=0.2)


def _following(master) -> set[int]:
    return {s.slave_id for s in master.roles.ha_master.slaves() if s.connected}


async def test_master_cut_off_from_the_controller_refuses_sends_within_a_lease(
        broker_config: BrokerConfig, tmp_path: Path, relays) -> None:
    """A silent partition between the master and the controller: within one lease the
    master refuses sends on the write path, though its in-sync slave still follows it."""
    relay_a, addr_a = await relays()
    relay_b, addr_b = await relays()
    async with InProcessCluster(_base(broker_config), tmp_path) as c:
        await c.namesrv()
        a = await c.broker("broker-a", controller_addr=addr_a)
        await c.broker("broker-a", broker_id=1, controller_addr=addr_b)
        await eventually(lambda: a.roles.sync_state_set == {0, 1} and _following(a) == {1})
        client = RemotingClient(a.broker_addr)
        try:
            assert (await client.invoke(send_request("Fence", b"before"), 5)).code == ResponseCode.SUCCESS
            relay_a.silent = relay_b.silent = True  # nobody can be promoted: the slave follows on
            cut = time.monotonic()
            resp = None
            for i in range(400):  # bounded: ~4 s of sends
                resp = await client.invoke(send_request("Fence", b"after %d" % i), 5)
                if resp.code != ResponseCode.SUCCESS:
                    break
                await asyncio.sleep(0.01)
            refused_after = time.monotonic() - cut
            assert resp is not None and resp.code == ResponseCode.SERVICE_NOT_AVAILABLE, resp
            assert "lease" in (resp.remark or "")
            assert refused_after < LEASE + 1.5, refused_after  # one lease, and then some slack
            assert _following(a) == {1} and a.roles.is_master
        finally:
            await client.close()


async def test_sync_master_that_cannot_shrink_its_in_sync_set_answers_outcome_unknown(
        broker_config: BrokerConfig, tmp_path: Path, controller: ControllerProcess,
        relays) -> None:
    """A SYNC_MASTER whose slave is gone and whose set change never reaches the controller:
    the send is stored but not acknowledged (SYSTEM_ERROR, which clients retry), and
    consumers do not see it while the controller's set still names the slave."""
    relay_a, addr_a = await relays()
    async with InProcessCluster(_base(broker_config), tmp_path) as c:
        await c.namesrv()
        a = await c.broker("broker-a", controller_addr=addr_a, broker_role="SYNC_MASTER")
        b = await c.broker("broker-a", broker_id=1, broker_role="SYNC_MASTER",
                           controller_addr=controller.addr)
        await eventually(lambda: a.roles.sync_state_set == {0, 1} and _following(a) == {1})
        client = RemotingClient(a.broker_addr)
        try:
            ok = await client.invoke(send_request("Sync", b"replicated"), 5)
            assert ok.code == ResponseCode.SUCCESS
            relay_a.drop_requests.add(RequestCode.CONTROLLER_ALTER_SYNC_STATE_SET)
            c.brokers.remove(b)
            await b.stop()
            await eventually(lambda: _following(a) == set())
            resp = await client.invoke(send_request("Sync", b"unreplicated"), 15)
            assert a.roles.sync_state_set == {0, 1}
            # Visibility follows the set the controller holds, not the connected slaves.
            got = a.store.get("Sync", 0, 0, 10)
            assert [m.body for m in got.messages()] == [b"replicated"]
            assert resp.code == ResponseCode.SYSTEM_ERROR, (resp.code, resp.remark)
            assert "may or may not be delivered" in (resp.remark or "")
            assert a.store.fenced is None  # the lease holds: it is the set, not the lease
            # The controller is reached again: the set shrinks, and the message shows.
            relay_a.drop_requests.clear()
            await eventually(lambda: a.roles.sync_state_set == {0}, timeout=10)
            await eventually(lambda: [m.body for m in a.store.get("Sync", 0, 0, 10).messages()]
                             == [b"replicated", b"unreplicated"])
        finally:
            await client.close()


async def test_a_master_promoted_without_a_valid_lease_stays_fenced(
        broker_config: BrokerConfig, tmp_path: Path, controller: ControllerProcess,
        relays) -> None:
    """The controller promotes b, but b never hears a heartbeat answered (its lease was
    never renewed): b becomes master and lifts no fence."""
    relay_b, addr_b = await relays()
    relay_b.drop_answers_to.add(RequestCode.BROKER_HEARTBEAT)
    seen: list[object] = []
    watched: list = []  # b, once started

    class AtPromotion(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            for broker in watched:
                if "is now the master" in str(record.msg) and record.args[0] == broker.roles.name:
                    seen.append(broker.store.fenced)  # the gate, as the promotion ends

    handler = AtPromotion()
    logging.getLogger("txbroker.cluster.roles").addHandler(handler)
    try:
        async with InProcessCluster(_base(broker_config), tmp_path) as c:
            await c.namesrv()
            a = await c.broker("broker-a", controller_addr=controller.addr)
            b = await c.broker("broker-a", broker_id=1, controller_addr=addr_b)
            watched.append(b)
            await eventually(lambda: a.roles.sync_state_set == {0, 1} and _following(a) == {1})
            c.brokers.remove(a)
            await a.stop()
            await eventually(lambda: b.roles.is_master, timeout=15)
            assert seen == [Fence.LEASE_NOT_VALID]
            client = RemotingClient(b.broker_addr)
            try:
                resp = await client.invoke(send_request("Promoted", b"x"), 5)
                assert resp.code == ResponseCode.SERVICE_NOT_AVAILABLE and "lease" in resp.remark
            finally:
                await client.close()
    finally:
        logging.getLogger("txbroker.cluster.roles").removeHandler(handler)


async def test_named_master_under_an_epoch_older_than_its_log_stays_a_fenced_slave(
        broker_config: BrokerConfig, tmp_path: Path, controller: ControllerProcess,
        caplog: pytest.LogCaptureFixture) -> None:
    """A controller whose state was reset names the broker master under epoch 1, but its
    log already holds epoch 3: it refuses, stays a fenced slave, says so once."""
    data = tmp_path / "a"
    data.mkdir()
    EpochFile(data / EPOCH_FILE_NAME).append(3, 0)
    async with InProcessCluster(_base(broker_config), tmp_path) as c:
        await c.namesrv()
        with caplog.at_level(logging.ERROR, logger="txbroker.cluster.roles"):
            a = await c.broker("broker-a", controller_addr=controller.addr, data_dir=data)
            await asyncio.sleep(4 * 0.2)  # several heartbeat answers, each applied again
        assert not a.roles.is_master and a.store.fenced is Fence.SLAVE
        assert a.roles.role is Role.SLAVE
        refusals = [r for r in caplog.records if "not promoted" in r.getMessage()]
        assert len(refusals) == 1, [r.getMessage() for r in caplog.records]
        assert "epoch 1" in refusals[0].getMessage() and "epoch 3" in refusals[0].getMessage()
        assert a.store.epochs.last_epoch == 3


async def test_promotion_rewrites_a_missing_op_record(
        broker_config: BrokerConfig, tmp_path: Path, controller: ControllerProcess) -> None:
    """A committed half whose op record the old master never wrote: the new master's
    recovery finds it, and its op record is written once the fence is lifted."""
    async with InProcessCluster(_base(broker_config), tmp_path) as c:
        await c.namesrv()
        a = await c.broker("broker-a", controller_addr=controller.addr)
        b = await c.broker("broker-a", broker_id=1, controller_addr=controller.addr)
        await eventually(lambda: a.roles.sync_state_set == {0, 1} and _following(a) == {1})
        half = half_msg(b"committed", uniq="MISSING-OP")
        prepared = await a.tx.prepare(half, None)
        assert prepared.ok
        # The commit's final message is stored, its op record is not (a crash between them).
        stored = a.tx.read_half(prepared.physical_offset)
        final = await a.store.put(final_message(stored, prepared.physical_offset,
                                                prepared.store_timestamp))
        assert final.ok
        await eventually(lambda: b.store.max_physical_offset == a.store.max_physical_offset)
        c.brokers.remove(a)
        await a.stop()
        await eventually(lambda: b.roles.is_master, timeout=15)
        ops = [m for m in b.store.scan(0) if m.topic == OP_HALF_TOPIC]
        assert [m.body for m in ops] == [str(prepared.queue_offset).encode()]
        assert b.tx._missing_ops == []


async def test_stopping_sync_master_acknowledges_only_what_its_slave_holds(
        broker_config: BrokerConfig, tmp_path: Path) -> None:
    """Sends in flight while a SYNC_MASTER stops cleanly: every send answered as sent
    (SEND_OK, FLUSH_SLAVE_TIMEOUT, SLAVE_NOT_AVAILABLE) is held by the slave; the others are
    refused with a retriable error."""
    async with InProcessCluster(broker_config.replace(metadata_sync_interval=0.2), tmp_path) as c:
        await c.namesrv()
        a = await c.broker("broker-a", broker_role="SYNC_MASTER")
        b = await c.broker("broker-a", broker_id=1)
        await eventually(lambda: _following(a) == {1})
        client = RemotingClient(a.broker_addr)
        answers: list[tuple[int, str, bytes]] = []
        deadline = time.monotonic() + 20

        async def sender(n: int) -> None:
            for i in range(200):  # bounded in count and time
                if time.monotonic() > deadline:
                    return
                body = b"w%d-%d" % (n, i)
                try:
                    resp = await client.invoke(send_request("Stop", body), 5)
                except (OSError, TimeoutError, ConnectionError):
                    return
                answers.append((resp.code, resp.ext_fields.get("msgId", ""), body))

        workers = [asyncio.create_task(sender(n)) for n in range(16)]
        try:
            await eventually(lambda: len(answers) > 100, timeout=15)
            c.brokers.remove(a)
            await asyncio.wait_for(a.stop(), 30)  # a stop under load ends (grace 2 s)
            await asyncio.wait_for(asyncio.gather(*workers, return_exceptions=True), 30)
        finally:
            for w in workers:
                w.cancel()
            await client.close()
        acked = {ResponseCode.SUCCESS, ResponseCode.FLUSH_SLAVE_TIMEOUT,
                 ResponseCode.SLAVE_NOT_AVAILABLE}
        sent = [(msg_id, body) for code, msg_id, body in answers if code in acked]
        refused = [code for code, _, _ in answers if code not in acked]
        assert sent
        missing = []
        for msg_id, body in sent:
            held = b.store.read(decode_offset_msg_id(msg_id)[2])
            if held is None or held.body != body:
                missing.append(body)
        assert not missing, f"{len(missing)} of {len(sent)} sends acknowledged, not on the slave"
        assert set(refused) <= {ResponseCode.SERVICE_NOT_AVAILABLE}


async def _group_of_three(c: InProcessCluster, controller: ControllerProcess, relays,
                          proxies: list[FaultProxy]) -> tuple[Relay, object, object, object, FaultProxy]:
    """A SYNC_MASTER (id 0, its controller link through a relay) with slaves 1 and 2
    (``min_in_sync_replicas`` = 1), slave 2 following it through a proxy the test can hold;
    returns once the controller's in-sync set is all three and each slave holds a first send."""
    relay_a, addr_a = await relays()
    await c.namesrv()
    a = await c.broker("broker-a", controller_addr=addr_a, broker_role="SYNC_MASTER")
    host, port = a.roles.ha_addr.rsplit(":", 1)
    proxy = await FaultProxy(host, int(port)).start()
    proxies.append(proxy)
    relay_2, addr_2 = await relays()
    relay_2.ha_addr_seen_as[a.roles.ha_addr] = proxy.addr
    b1 = await c.broker("broker-a", broker_id=1, broker_role="SYNC_MASTER",
                        controller_addr=controller.addr)
    b2 = await c.broker("broker-a", broker_id=2, broker_role="SYNC_MASTER", controller_addr=addr_2)
    await eventually(lambda: _in_sync(controller) == {0, 1, 2} and _following(a) == {1, 2})
    return relay_a, a, b1, b2, proxy


def _in_sync(controller: ControllerProcess) -> set[int]:
    return set(controller.state.replica_info("broker-a").sync_state_set)


def _acks(master) -> dict[int, int]:
    return {s.slave_id: s.ack_offset for s in master.roles.ha_master.slaves()}


def _missing(broker, sent: list[tuple[str, bytes]]) -> list[bytes]:
    """The bodies of ``sent`` (msgId, body) that ``broker``'s log does not hold."""
    missing = []
    for msg_id, body in sent:
        held = broker.store.read(decode_offset_msg_id(msg_id)[2])
        if held is None or held.body != body:
            missing.append(body)
    return missing


#: Answers a RocketMQ client counts as sent (the message is stored).
SENT = {ResponseCode.SUCCESS, ResponseCode.FLUSH_SLAVE_TIMEOUT, ResponseCode.SLAVE_NOT_AVAILABLE}


@pytest.fixture
async def proxies():
    made: list[FaultProxy] = []
    try:
        yield made
    finally:
        for p in made:
            await p.close()


async def test_sync_master_acknowledges_once_every_in_sync_slave_holds_a_send_or_left_the_set(
        broker_config: BrokerConfig, tmp_path: Path, controller: ControllerProcess, relays,
        proxies) -> None:
    """Two slaves, one stalled (nothing reaches it, nothing comes back): with
    ``min_in_sync_replicas`` = 1 a send that slave 1 holds is still not acknowledged while the
    controller's set names slave 2; it is acknowledged once the set is {0, 1}.  Then the
    master and slave 1 are lost: slave 2, lacking the send, is not elected, and slave 1, back,
    is, holding every send acknowledged."""
    async with InProcessCluster(_base(broker_config), tmp_path) as c:
        relay_a, a, b1, b2, proxy = await _group_of_three(c, controller, relays, proxies)
        client = RemotingClient(a.broker_addr)
        sent: list[tuple[str, bytes]] = []
        try:
            first = await client.invoke(send_request("Isr", b"m0"), 5)
            assert first.code == ResponseCode.SUCCESS
            sent.append((first.ext_fields["msgId"], b"m0"))
            await eventually(lambda: _acks(a).get(2) == a.store.max_physical_offset)
            proxy.hold()  # slave 2 stalls; its connection stays open
            # Set changes take a while to reach the controller, so an answer given before
            # the set changed is seen as such.
            relay_a.delay_requests[RequestCode.CONTROLLER_ALTER_SYNC_STATE_SET] = 0.5
            for i in range(1, 4):
                resp = await client.invoke(send_request("Isr", b"m%d" % i), 15)
                in_sync = _in_sync(controller)
                assert resp.code == ResponseCode.SUCCESS, (resp.code, resp.remark)
                assert in_sync == {0, 1}, f"m{i} acknowledged while the controller's in-sync " \
                                          f"set is {sorted(in_sync)}"
                sent.append((resp.ext_fields["msgId"], b"m%d" % i))
            assert _missing(b2, sent) == [b"m1", b"m2", b"m3"]
        finally:
            await client.close()
        b1_dir = b1.config.data_dir
        for gone in (a, b1):  # the double fault
            c.brokers.remove(gone)
            await gone.stop()
        # Several leases: time enough for an election of slave 2, were it in the set.
        await asyncio.sleep(4 * LEASE)
        assert not b2.roles.is_master
        assert controller.state.replica_info("broker-a").master_broker_id == 0
        back = await c.broker("broker-a", broker_id=1, broker_role="SYNC_MASTER",
                              data_dir=b1_dir, controller_addr=controller.addr)
        await eventually(lambda: back.roles.is_master, timeout=15)
        assert controller.state.replica_info("broker-a").master_broker_id == 1
        assert _missing(back, sent) == []
        # Slave 2 follows the new master (directly: only the old master's HA address went
        # through the proxy) and gets what it lacked.
        await eventually(lambda: _missing(b2, sent) == [], timeout=15)


async def test_double_fault_after_a_send_the_set_could_not_drop_a_slave_for_loses_no_acknowledgedsend_request(
        broker_config: BrokerConfig, tmp_path: Path, controller: ControllerProcess, relays,
        proxies) -> None:
    """Two slaves, one stalled, and the master's set changes never reach the controller: a
    send only slave 1 holds is not acknowledged (the controller's set still names slave 2).
    The master and slave 1 are then lost and the controller elects slave 2: it holds every
    send that was acknowledged."""
    async with InProcessCluster(_base(broker_config), tmp_path) as c:
        relay_a, a, b1, b2, proxy = await _group_of_three(c, controller, relays, proxies)
        client = RemotingClient(a.broker_addr)
        answers: list[tuple[int, str, bytes]] = []
        try:
            first = await client.invoke(send_request("Isr", b"m0"), 5)
            answers.append((first.code, first.ext_fields.get("msgId", ""), b"m0"))
            await eventually(lambda: _acks(a).get(2) == a.store.max_physical_offset)
            proxy.hold()
            relay_a.drop_requests.add(RequestCode.CONTROLLER_ALTER_SYNC_STATE_SET)
            second = await client.invoke(send_request("Isr", b"m1"), 15)
            answers.append((second.code, second.ext_fields.get("msgId", ""), b"m1"))
            await eventually(lambda: _acks(a).get(1) == a.store.max_physical_offset)
        finally:
            await client.close()
        assert _in_sync(controller) == {0, 1, 2}
        for gone in (a, b1):  # the double fault
            c.brokers.remove(gone)
            await gone.stop()
        await eventually(lambda: b2.roles.is_master, timeout=15)
        sent = [(msg_id, body) for code, msg_id, body in answers if code in SENT]
        assert _missing(b2, sent) == [], f"acknowledged, yet not on the elected replica: " \
                                         f"{_missing(b2, sent)}"
        assert [code for code, _, _ in answers] == [ResponseCode.SUCCESS, ResponseCode.SYSTEM_ERROR]
        assert "may or may not be delivered" in (second.remark or "")


async def test_a_slave_the_set_may_hold_since_an_unanswered_change_is_waited_for(
        broker_config: BrokerConfig, tmp_path: Path, controller: ControllerProcess, relays,
        proxies) -> None:
    """Slave 2, out of the set, catches up and the master asks to add it, but the answer is
    lost: the controller's set names slave 2 while no answer told the master so.  Slave 2
    then stalls and no set change reaches the controller: a send only slave 1 holds is not
    acknowledged, and after the master and slave 1 are lost the elected slave 2 holds every
    acknowledged send."""
    async with InProcessCluster(_base(broker_config), tmp_path) as c:
        relay_a, a, b1, b2, proxy = await _group_of_three(c, controller, relays, proxies)
        client = RemotingClient(a.broker_addr)
        answers: list[tuple[int, str, bytes]] = []

        async def send(body: bytes) -> RemotingCommand:
            resp = await client.invoke(send_request("Isr", body), 15)
            answers.append((resp.code, resp.ext_fields.get("msgId", ""), body))
            return resp

        try:
            proxy.hold()
            await send(b"m0")  # slave 2 leaves the set
            await eventually(lambda: _in_sync(controller) == {0, 1})
            relay_a.drop_answers_to.add(RequestCode.CONTROLLER_ALTER_SYNC_STATE_SET)
            proxy.release()
            await eventually(lambda: _in_sync(controller) == {0, 1, 2}, timeout=10)
            relay_a.drop_requests.add(RequestCode.CONTROLLER_ALTER_SYNC_STATE_SET)
            proxy.hold()
            last = await send(b"m1")
            await eventually(lambda: _acks(a).get(1) == a.store.max_physical_offset)
        finally:
            await client.close()
        assert _in_sync(controller) == {0, 1, 2}
        for gone in (a, b1):  # the double fault
            c.brokers.remove(gone)
            await gone.stop()
        await eventually(lambda: b2.roles.is_master, timeout=15)
        sent = [(msg_id, body) for code, msg_id, body in answers if code in SENT]
        assert _missing(b2, sent) == [], f"acknowledged, yet not on the elected replica: " \
                                         f"{_missing(b2, sent)}"
        assert last.code == ResponseCode.SYSTEM_ERROR, (last.code, last.remark)
