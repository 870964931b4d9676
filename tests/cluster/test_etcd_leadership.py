"""etcd mode: a group's master is the holder of its leader key, fenced by its own count of
its etcd lease (docs/cluster.md, "Consensus on etcd").

Real parts: a three-member etcd (separate processes on loopback), a name server and brokers
on the test's loop.  A broker cut off from etcd is one whose etcd endpoints are relays the
test holds (nothing forwarded, nothing closed: a silent partition), while its clients and
its slave still reach it.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest
from support.cluster import InProcessCluster, send_request
from support.waiting import eventually

from txbroker.bench.chaos.faultproxy import FaultProxy
from txbroker.cluster.etcd import Etcd, parse_endpoints
from txbroker.cluster.leadership import GroupKeys
from txbroker.cluster.local_etcd import LocalEtcd
from txbroker.config import BrokerConfig, ConfigError
from txbroker.remoting.client import RemotingClient
from txbroker.remoting.codes import ResponseCode

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("etcd")]

LEASE = 2  # etcd's shortest with its default timing


class EtcdCluster(InProcessCluster):
    """An in-process cluster whose brokers elect their masters on ``etcd`` (each broker's
    ``etcd_endpoints`` may be overridden, e.g. with relays)."""

    def __init__(self, base: BrokerConfig, tmp_path: Path, etcd: LocalEtcd, lease: int = LEASE) -> None:
        super().__init__(base.replace(metadata_sync_interval=0.2, broker_role="SYNC_MASTER"),
                         tmp_path)
        self.etcd = etcd
        self.lease = lease

    async def broker(self, broker_name: str = "broker-a", **changes: object):
        changes.setdefault("etcd_endpoints", self.etcd.endpoints)
        changes.setdefault("etcd_lease", self.lease)
        return await super().broker(broker_name, **changes)


def _following(master) -> set[int]:
    return {s.slave_id for s in master.roles.ha_master.slaves() if s.connected}


async def _send_until(client: RemotingClient, topic: str, done, acked: list[float],
                      refused: list[tuple[float, str]] | None = None) -> None:
    """Send to ``topic`` every 10 ms until ``done()`` (bounded: 800 sends), recording when
    each acknowledgement (and refusal, with its remark) arrived."""
    for i in range(800):
        resp = await client.invoke(send_request(topic, b"c%d" % i), 5)
        if resp.code == ResponseCode.SUCCESS:
            acked.append(time.monotonic())
        elif refused is not None:
            refused.append((time.monotonic(), resp.remark or ""))
        if done():
            return
        await asyncio.sleep(0.01)


async def _proxies(etcd: LocalEtcd) -> list[FaultProxy]:
    out = []
    for m in etcd.members:
        host, port = m.endpoint.rsplit(":", 1)
        out.append(await FaultProxy(host, int(port)).start())
    return out


def test_etcd_settings_are_checked(broker_config: BrokerConfig) -> None:
    cluster = broker_config.replace(namesrv_addr="127.0.0.1:9876")
    with pytest.raises(ConfigError, match="controller_addr are both set"):
        cluster.replace(etcd_endpoints="127.0.0.1:2379", controller_addr="127.0.0.1:9878")
    with pytest.raises(ConfigError, match="without namesrv_addr"):
        broker_config.replace(etcd_endpoints="127.0.0.1:2379")
    with pytest.raises(ConfigError, match="etcd_lease=1"):
        cluster.replace(etcd_endpoints="127.0.0.1:2379", etcd_lease=1)
    with pytest.raises(ConfigError, match="etcd_endpoints: 'nope' is not host:port"):
        cluster.replace(etcd_endpoints="nope")
    with pytest.raises(ConfigError, match="set both"):
        cluster.replace(etcd_endpoints="127.0.0.1:2379", etcd_user="root")
    ok = cluster.replace(etcd_endpoints="http://127.0.0.1:2379,127.0.0.1:22379")
    assert parse_endpoints(ok.etcd_endpoints) == ["127.0.0.1:2379", "127.0.0.1:22379"]
    assert ok.timing().lease == 3 and ok.timing().controller_heartbeat == 0.5
    assert "etcd_password" not in repr(ok.replace(etcd_user="u", etcd_password="secret-pw"))


async def test_first_master_then_a_clean_stop_hands_over(broker_config: BrokerConfig,
                                                          tmp_path: Path, etcd_cluster) -> None:
    """The broker configured as id 0 takes the group's first epoch; its slave joins the
    in-sync set; a clean stop revokes the master's lease and the slave is master within a
    renewal interval or two, under a newer epoch, with every acknowledged send."""
    async with EtcdCluster(broker_config, tmp_path, etcd_cluster) as c:
        await c.namesrv()
        a = await c.broker("broker-a")
        b = await c.broker("broker-a", broker_id=1)
        assert a.roles.is_master and a.roles.epoch == 1
        await eventually(lambda: a.roles.sync_state_set == {0, 1} and _following(a) == {1})
        client = RemotingClient(a.broker_addr)
        try:
            for i in range(20):
                assert (await client.invoke(send_request("Etcd", b"m%d" % i), 5)).code == ResponseCode.SUCCESS
        finally:
            await client.close()
        etcd = Etcd(parse_endpoints(etcd_cluster.endpoints))
        try:
            keys = GroupKeys.of(a.config)
            assert (await etcd.get(keys.leader)) is not None
            c.brokers.remove(a)
            stopped = time.monotonic()
            await a.stop()
            await eventually(lambda: b.roles.is_master, timeout=LEASE * 3)
            took = time.monotonic() - stopped
            assert took < LEASE, took  # the revoked lease, not its expiry
            assert b.roles.epoch == 2
            leader = await etcd.get(keys.leader)
            assert leader is not None and b'"brokerId":1' in leader.value
        finally:
            await etcd.close()
        got = b.store.get("Etcd", 0, 0, 100)
        assert [m.body for m in got.messages()] == [b"m%d" % i for i in range(20)]


async def test_master_cut_off_from_etcd_fences_itself_before_the_slave_is_elected(
        broker_config: BrokerConfig, tmp_path: Path, etcd_cluster) -> None:
    """The master loses etcd (every member, silently) but not its clients or its slave: it
    refuses writes within one lease of its last renewal, the slave is elected only after
    etcd drops that lease, so no send is acknowledged by the old master after the new one
    starts; at the heal the old master follows the new one."""
    proxies = await _proxies(etcd_cluster)
    try:
        async with EtcdCluster(broker_config, tmp_path, etcd_cluster) as c:
            await c.namesrv()
            a = await c.broker("broker-a", etcd_endpoints=";".join(p.addr for p in proxies))
            b = await c.broker("broker-a", broker_id=1)
            await eventually(lambda: a.roles.sync_state_set == {0, 1} and _following(a) == {1})
            client = RemotingClient(a.broker_addr)
            acked: list[float] = []
            try:
                # The topic exists first: creating one needs etcd (it is the group's).
                assert (await client.invoke(send_request("Cut", b"first"), 5)).code == ResponseCode.SUCCESS
                for p in proxies:
                    p.hold()
                cut = time.monotonic()
                refused: list[tuple[float, str]] = []
                await _send_until(client, "Cut", lambda: b.roles.is_master, acked, refused)
                refused_at = refused[0][0] if refused else None
                assert refused and "lease" in refused[0][1], refused[:1]
                await eventually(lambda: b.roles.is_master, timeout=LEASE * 4)
                promoted = time.monotonic()
                assert refused_at is not None and refused_at - cut < LEASE + 0.5, refused_at - cut
                assert not acked or acked[-1] < promoted
                assert all(t < refused_at for t in acked)
                assert b.roles.epoch == 2
            finally:
                await client.close()
            for p in proxies:
                p.release()
            await eventually(lambda: not a.roles.is_master and a.roles.epoch == 2
                             and a.roles.ha_slave is not None and a.roles.ha_slave.connected,
                             timeout=LEASE * 5)
            # Its etcd lease ran out meanwhile (and its replica key with it): it takes a new
            # one, and the new master takes it back into the in-sync set once caught up.
            await eventually(lambda: b.roles.sync_state_set == {0, 1}, timeout=LEASE * 5)
            # Everything the old master acknowledged is on the new one.
            bodies = {m.body for m in b.store.get("Cut", 0, 0, 1000).messages()}
            assert len(bodies) >= len(acked)
    finally:
        for p in proxies:
            await p.close()


async def test_losing_the_etcd_leader_costs_no_write(broker_config: BrokerConfig,
                                                     tmp_path: Path, etcd_cluster) -> None:
    """SIGKILL the etcd leader under steady sends: etcd elects another member within about
    a second, the broker renews through another endpoint, and its lease never lapses."""
    async with EtcdCluster(broker_config, tmp_path, etcd_cluster, lease=3) as c:
        await c.namesrv()
        a = await c.broker("broker-a")
        await c.broker("broker-a", broker_id=1)
        await eventually(lambda: a.roles.sync_state_set == {0, 1})
        client = RemotingClient(a.broker_addr)
        try:
            refused = []
            killed = None
            for i in range(500):  # ~5 s
                if i == 50:
                    killed = etcd_cluster.leader()
                    etcd_cluster.kill(killed)
                resp = await client.invoke(send_request("Steady", b"s%d" % i), 5)
                if resp.code != ResponseCode.SUCCESS:
                    refused.append((i, resp.code, resp.remark))
                await asyncio.sleep(0.01)
            assert killed is not None
            assert refused == []
            assert a.roles.is_master and a.roles.epoch == 1
        finally:
            await client.close()


async def test_losing_the_etcd_majority_stops_writes_within_a_lease(
        broker_config: BrokerConfig, tmp_path: Path, etcd_cluster) -> None:
    """Two of three etcd members down: nobody can be elected, and the master cannot know it
    still leads, so it refuses writes within one lease; when etcd is back it writes again
    under the same epoch (no one else was elected)."""
    async with EtcdCluster(broker_config, tmp_path, etcd_cluster) as c:
        await c.namesrv()
        a = await c.broker("broker-a")
        await c.broker("broker-a", broker_id=1)
        await eventually(lambda: a.roles.sync_state_set == {0, 1})
        client = RemotingClient(a.broker_addr)
        try:
            etcd_cluster.kill(1)
            etcd_cluster.kill(2)
            cut = time.monotonic()
            resp = None
            for i in range(500):
                resp = await client.invoke(send_request("Majority", b"x%d" % i), 5)
                if resp.code != ResponseCode.SUCCESS:
                    break
                await asyncio.sleep(0.01)
            assert resp is not None and resp.code == ResponseCode.SERVICE_NOT_AVAILABLE
            assert time.monotonic() - cut < LEASE + 1.0
            etcd_cluster.start_member(1, wait=False)
            etcd_cluster.start_member(2, wait=False)

            async def writes() -> bool:
                r = await client.invoke(send_request("Majority", b"back"), 5)
                return r.code == ResponseCode.SUCCESS
            await eventually(writes, timeout=30)
            assert a.roles.is_master
        finally:
            await client.close()


async def test_a_topic_created_just_before_the_master_dies_exists_on_its_successor(
        tmp_path: Path, etcd_cluster, broker_process) -> None:
    """A topic made by a producer's first send and written at once, then the master SIGKILLed
    well within the slave's metadata sync interval: the promoted slave has the topic (etcd
    held it before the creation was acknowledged), routes it, and serves every message.
    Before etcd mode the slave learned topics only from that periodic copy: the topic did not
    exist on the new master and its replicated messages were stranded."""
    from support.cluster import start_namesrv

    from txbroker.client import Consumer, Message, Producer

    ns = await start_namesrv()
    etcd = Etcd(parse_endpoints(etcd_cluster.endpoints))
    try:
        common = {"namesrv_addr": ns.addr, "etcd_endpoints": etcd_cluster.endpoints, "etcd_lease": LEASE,
                      "broker_role": "SYNC_MASTER", "metadata_sync_interval": 60.0}
        a = broker_process(**common, broker_id=0)
        broker_process(**common, broker_id=1)
        keys = GroupKeys(b"/txbroker/DefaultCluster/broker-a/")

        async def in_sync() -> bool:
            isr = await etcd.get(keys.isr)
            return isr is not None and b'"members":[0,1]' in isr.value
        await eventually(in_sync, timeout=30)
        async with Producer("fresh-producers", namesrv=ns.addr) as producer:
            for i in range(5):
                sent = await producer.send(Message("FreshTopic", b"fresh-%d" % i))
                assert sent.send_status.name == "SEND_OK", sent
        a.kill()

        async def promoted() -> bool:
            lead = await etcd.get(keys.leader)
            return lead is not None and b'"brokerId":1' in lead.value
        await eventually(promoted, timeout=LEASE * 5)
        consumer = Consumer("fresh-readers", namesrv=ns.addr, from_where="first")
        consumer.subscribe("FreshTopic", "*")
        async with consumer:
            from support.consuming import collect
            got = await collect(consumer, 5, timeout=60)
        assert sorted(m.body for m in got) == [b"fresh-%d" % i for i in range(5)]
    finally:
        await etcd.close()
        await ns.stop()


def _controller_state(tmp_path: Path) -> Path:
    """A controller's data directory whose broker-a was failed over to id 1 (epoch 2), with
    only id 1 in sync: the state etcd must learn before any election."""
    import orjson

    from txbroker.cluster.replicas import STATE_VERSION
    data = tmp_path / "controller"
    data.mkdir()
    doc = {"version": STATE_VERSION, "groups": [{
        "clusterName": "DefaultCluster", "brokerName": "broker-a",
        "replicas": {"0": {"address": "127.0.0.1:1", "haAddress": "127.0.0.1:2"},
                     "1": {"address": "127.0.0.1:3", "haAddress": "127.0.0.1:4"}},
        "masterBrokerId": 1, "masterEpoch": 2, "syncStateSet": [1], "syncStateSetEpoch": 3}]}
    (data / "controller.json").write_bytes(orjson.dumps(doc))
    return data


async def test_a_controller_state_is_imported_once(tmp_path: Path, etcd_cluster) -> None:
    from support.cli_runner import cli_ok, run_cli

    data = _controller_state(tmp_path)
    args = ("etcd-import", "--controller-data", str(data), "--etcd-endpoints", etcd_cluster.endpoints)
    assert cli_ok(await run_cli(*args)).strip() == \
        "group broker-a (DefaultCluster): imported, epoch 2, in sync [1]"
    assert cli_ok(await run_cli(*args)).strip() == \
        "group broker-a (DefaultCluster): already in etcd, unchanged"
    etcd = Etcd(parse_endpoints(etcd_cluster.endpoints))
    try:
        isr = await etcd.get(b"/txbroker/DefaultCluster/broker-a/isr")
        assert isr is not None and b'"members":[1]' in isr.value
    finally:
        await etcd.close()
    missing = await run_cli("etcd-import", "--controller-data", str(tmp_path / "nowhere"),
                            "--etcd-endpoints", etcd_cluster.endpoints)
    assert missing.exit_code == 1 and "no controller.json in" in missing.output


async def test_a_controller_era_master_is_not_elected_before_the_import(
        broker_config: BrokerConfig, tmp_path: Path, etcd_cluster, caplog) -> None:
    """Broker id 0 whose log holds epoch 2 (written under a controller) and an etcd with no
    state for its group: it starts no election (its slave may hold writes it lacks) and says
    once, in one line, to import the controller's state; after the import the group's in-sync
    member is elected instead."""
    from txbroker.store.epochs import FILE_NAME, EpochFile

    data = tmp_path / "a-0"
    data.mkdir()
    EpochFile(data / FILE_NAME).append(2, 0)
    async with EtcdCluster(broker_config, tmp_path, etcd_cluster) as c:
        await c.namesrv()
        a = await c.broker("broker-a", data_dir=data)
        await asyncio.sleep(LEASE)
        assert not a.roles.is_master
        said = [r.message for r in caplog.records if "etcd-import" in r.message]
        assert len(said) == 1 and "epoch 2" in said[0], said
        etcd = Etcd(parse_endpoints(etcd_cluster.endpoints))
        try:
            from txbroker.cluster.upgrade import import_groups, read_controller_state
            await import_groups(etcd, "/txbroker", read_controller_state(_controller_state(tmp_path)))
        finally:
            await etcd.close()
        b = await c.broker("broker-a", broker_id=1)
        await eventually(lambda: b.roles.is_master, timeout=LEASE * 4)
        assert b.roles.epoch == 3 and not a.roles.is_master


async def test_switchover_fences_the_old_master_before_the_new_one_writes(
        broker_config: BrokerConfig, tmp_path: Path, etcd_cluster) -> None:
    """``txbroker switchover`` under steady sends: the master fences itself, then releases its
    leader key; the named slave is elected under the next epoch; no send is acknowledged by
    the old master after the new one starts, and the old master follows the new one."""
    from support.cli_runner import cli_ok, run_cli

    async with EtcdCluster(broker_config, tmp_path, etcd_cluster) as c:
        await c.namesrv()
        a = await c.broker("broker-a")
        b = await c.broker("broker-a", broker_id=1)
        await eventually(lambda: a.roles.sync_state_set == {0, 1} and _following(a) == {1})
        client = RemotingClient(a.broker_addr)
        acked: list[float] = []
        promoted_at: list[float] = []
        stop = asyncio.Event()

        async def sends() -> None:
            for i in range(2000):  # bounded
                if stop.is_set():
                    return
                resp = await client.invoke(send_request("Switch", b"w%d" % i), 5)
                if resp.code == ResponseCode.SUCCESS:
                    acked.append(time.monotonic())
                if b.roles.is_master and not promoted_at:
                    promoted_at.append(time.monotonic())
                await asyncio.sleep(0.005)
        try:
            assert (await client.invoke(send_request("Switch", b"first"), 5)).code == ResponseCode.SUCCESS
            task = asyncio.ensure_future(sends())
            await asyncio.sleep(0.5)
            out = cli_ok(await run_cli("switchover", "--broker-name", "broker-a", "--to", "1",
                                       "--etcd-endpoints", etcd_cluster.endpoints))
            assert out.strip() == "group broker-a: master is now id 1, epoch 2", out
            await eventually(lambda: bool(promoted_at))
            await asyncio.sleep(0.3)
            stop.set()
            await task
        finally:
            await client.close()
        assert acked and all(t < promoted_at[0] for t in acked)
        await eventually(lambda: a.roles.ha_slave is not None and a.roles.ha_slave.connected
                         and not a.roles.is_master and a.roles.epoch == 2, timeout=LEASE * 4)
        # Every send the old master acknowledged is on the new one.
        assert len(b.store.get("Switch", 0, 0, 5000).messages()) >= len(acked) + 1
        bad = await run_cli("switchover", "--broker-name", "broker-a", "--to", "1",
                            "--etcd-endpoints", etcd_cluster.endpoints)
        assert bad.exit_code == 1 and "master already" in bad.output


async def test_switchover_to_a_master_cut_off_from_etcd_makes_no_second_master(
        broker_config: BrokerConfig, tmp_path: Path, etcd_cluster) -> None:
    """The master is cut off from etcd (not from its clients) when a switch-over is asked:
    it never sees the request, so the target is elected only once etcd dropped the old
    master's lease, by which time the old master had stopped acknowledging on its own count."""
    from txbroker.cluster.switchover import switch_over

    proxies = await _proxies(etcd_cluster)
    try:
        async with EtcdCluster(broker_config, tmp_path, etcd_cluster) as c:
            await c.namesrv()
            a = await c.broker("broker-a", etcd_endpoints=";".join(p.addr for p in proxies))
            b = await c.broker("broker-a", broker_id=1)
            await eventually(lambda: a.roles.sync_state_set == {0, 1} and _following(a) == {1})
            client = RemotingClient(a.broker_addr)
            acked: list[float] = []
            etcd = Etcd(parse_endpoints(etcd_cluster.endpoints))
            try:
                assert (await client.invoke(send_request("Cut", b"first"), 5)).code == ResponseCode.SUCCESS
                for p in proxies:
                    p.hold()
                switching = asyncio.ensure_future(switch_over(etcd, GroupKeys.of(b.config), 1))
                await _send_until(client, "Cut", lambda: b.roles.is_master, acked)
                promoted = time.monotonic()
                assert await switching == 2
                assert b.roles.is_master and all(t < promoted for t in acked)
            finally:
                await client.close()
                await etcd.close()
            for p in proxies:
                p.release()
            await eventually(lambda: not a.roles.is_master and a.roles.epoch == 2,
                             timeout=LEASE * 5)
    finally:
        for p in proxies:
            await p.close()


async def test_stop_mirrors_start(broker_config: BrokerConfig, tmp_path: Path, etcd_cluster) -> None:
    """What start made, stop undoes: the election link is closed and gone (no lease for the
    write gate to read), the topic publisher detached, the Kafka staging promotion started
    suspended; a put after the stop is refused."""
    from txbroker.store.results import Fence

    async with EtcdCluster(broker_config, tmp_path, etcd_cluster) as c:
        await c.namesrv()
        a = await c.broker("broker-a", kafka_port=0, kafka_node_id=1)
        assert a.roles.is_master and a.kafka_staging is not None and a.kafka_staging.ready
        assert a.topics.publisher is not None and a.roles.link is not None
        c.brokers.remove(a)
        await a.stop()
        assert a.roles.link is None and a.topics.publisher is None
        assert not a.kafka_staging.ready
        assert a.roles._gate() in (Fence.STOPPING, Fence.LEASE_NOT_VALID)
        assert not a.roles._lease_holds()
