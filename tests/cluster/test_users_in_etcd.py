"""etcd mode: users, access keys, roles and Kafka ACL bindings are the cluster's, in etcd
(``txbroker/cluster/user_keys.py``; docs/security.md "Users", docs/cluster.md "Consensus on
etcd").

Real parts: a three-member etcd (separate processes on loopback), a name server, brokers of
two groups on the test's loop, each with a users file of its own (as brokers on separate
machines have), raw Kafka frames through real sockets, ``txbroker user`` / ``acl`` run
in-process against etcd.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest
from support.cli_runner import cli_ok, run_cli
from support.cluster import InProcessCluster
from support.kafka_sasl import scram_client
from support.waiting import eventually

from txbroker.cluster.etcd import Etcd, parse_endpoints
from txbroker.cluster.local_etcd import LocalEtcd
from txbroker.cluster.user_keys import POLL_INTERVAL, ClusterUsers, EtcdUsers
from txbroker.config import BrokerConfig
from txbroker.remoting.kafka.apis import ApiKey
from txbroker.remoting.kafka.errors import ErrorCode
from txbroker.remoting.kafka.framing import decode_response, encode_request
from txbroker.service.kafka.acls import (
    AclBinding,
    AclFilter,
    AclOperation,
    AclPermission,
    PatternType,
    ResourceType,
)
from txbroker.service.topics import TopicConfig
from txbroker.service.users import Users, load_users, write_users

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("etcd")]

LEASE = 2
MECH = "SCRAM-SHA-256"
PASSWORDS = {"alice": "alice-secret", "bob": "bob-secret", "dave": "dave-secret"}
TOPIC = "orders"
WAIT = 10.0


class EtcdCluster(InProcessCluster):
    """An in-process cluster whose brokers elect their masters on ``etcd`` (as in
    test_etcd_leadership.py), each broker with Kafka SASL and a users file of its own."""

    def __init__(self, base: BrokerConfig, tmp_path: Path, etcd: LocalEtcd) -> None:
        super().__init__(base.replace(metadata_sync_interval=0.2), tmp_path)
        self.etcd = etcd

    async def broker(self, broker_name: str = "broker-a", **changes: object):
        changes.setdefault("etcd_endpoints", self.etcd.endpoints)
        changes.setdefault("etcd_lease", LEASE)
        changes.setdefault("kafka_port", 0)
        changes.setdefault("kafka_node_id", len(self.brokers) + 1)
        changes.setdefault("kafka_cluster_refresh_interval", 0.1)
        changes.setdefault("kafka_sasl_mechanisms", MECH)
        changes.setdefault("cluster_secret", "users-test-cluster-secret")
        return await super().broker(broker_name, **changes)


def users_file(path: Path) -> str:
    """alice (admin) and bob (nothing), as ``txbroker user add`` writes them."""
    users = Users().with_password("alice", PASSWORDS["alice"], ("admin",)).with_password(
        "bob", PASSWORDS["bob"])
    write_users(path, users)
    return str(path)


class Wire:
    """One raw Kafka connection, logged in."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.corr = 0

    @classmethod
    async def login(cls, port: int, user: str, password: str | None = None) -> Wire:
        wire = cls(*await asyncio.open_connection("127.0.0.1", port))
        answer = await wire.scram(user, password or PASSWORDS[user])
        assert answer["error_code"] == ErrorCode.NONE, answer
        return wire

    async def call(self, key: int, version: int, body: dict) -> dict:
        self.corr += 1
        self.writer.write(encode_request(key, version, self.corr, "users-test", body))
        size = int.from_bytes(await asyncio.wait_for(self.reader.readexactly(4), WAIT), "big")
        got, answer = decode_response(key, version,
                                      await asyncio.wait_for(self.reader.readexactly(size), WAIT))
        assert got == self.corr
        return answer

    async def scram(self, user: str, password: str) -> dict:
        assert (await self.call(ApiKey.SASL_HANDSHAKE, 1, {"mechanism": MECH}))["error_code"] == 0
        bare = f"n={user},r=etcdnonce"
        first = await self.call(ApiKey.SASL_AUTHENTICATE, 2, {"auth_bytes": f"n,,{bare}".encode()})
        if first["error_code"] != ErrorCode.NONE:
            return first
        final, _ = scram_client(MECH, user, password, first["auth_bytes"], bare)
        return await self.call(ApiKey.SASL_AUTHENTICATE, 2, {"auth_bytes": final})

    def close(self) -> None:
        self.writer.close()


async def logs_in(port: int, user: str, password: str) -> bool:
    wire = Wire(*await asyncio.open_connection("127.0.0.1", port))
    try:
        return (await wire.scram(user, password))["error_code"] == ErrorCode.NONE
    finally:
        wire.close()


async def topic_code(wire: Wire) -> int:
    """The error code of TOPIC in a Metadata answer (DESCRIBE on it is what is checked)."""
    answer = await wire.call(ApiKey.METADATA, 4, {"topics": [{"name": TOPIC}],
                                                  "allow_auto_topic_creation": False})
    return answer["topics"][0]["error_code"]


def creation(op: AclOperation, permission: AclPermission = AclPermission.ALLOW) -> dict:
    return {"resource_type": ResourceType.TOPIC, "resource_name": TOPIC,
            "resource_pattern_type": PatternType.LITERAL, "principal": "User:bob", "host": "*",
            "operation": op, "permission_type": permission}


async def two_groups(c: EtcdCluster, tmp_path: Path):
    """broker-a and broker-b (masters of their groups, Kafka nodes 1 and 2), each with its own
    users file holding alice and bob; TOPIC on broker-b, seen by both Kafka views."""
    await c.namesrv()
    a = await c.broker("broker-a", users_file=users_file(tmp_path / "a-users.json"))
    b = await c.broker("broker-b", users_file=users_file(tmp_path / "b-users.json"))
    await eventually(lambda: a.roles.is_master and b.roles.is_master, msg="both masters")
    await b.topics.create_or_update(TopicConfig(TOPIC, 1, 1))
    for broker in (a, b):
        await eventually(lambda broker=broker: len(broker.kafka_view.slots(TOPIC)) == 1,
                         msg="views see the topic")
    return a, b


async def test_a_kafka_acl_created_through_one_group_is_enforced_by_another(
        broker_config: BrokerConfig, tmp_path: Path, etcd_cluster) -> None:
    """The review's finding: CreateAcls answered by broker-a is enforced by broker-b (another
    group, its own users file) within the poll interval, and DescribeAcls on broker-b shows
    it at once; a DENY made there then applies on broker-a too."""
    async with EtcdCluster(broker_config, tmp_path, etcd_cluster) as c:
        a, b = await two_groups(c, tmp_path)
        bob_a = await Wire.login(a.kafka_port, "bob")
        bob_b = await Wire.login(b.kafka_port, "bob")
        admin_a = await Wire.login(a.kafka_port, "alice")
        admin_b = await Wire.login(b.kafka_port, "alice")
        try:
            assert await topic_code(bob_b) == ErrorCode.TOPIC_AUTHORIZATION_FAILED
            answer = await admin_a.call(ApiKey.CREATE_ACLS, 2,
                                        {"creations": [creation(AclOperation.DESCRIBE)]})
            acked = time.monotonic()
            assert [r["error_code"] for r in answer["results"]] == [ErrorCode.NONE]
            assert await topic_code(bob_a) == ErrorCode.NONE  # in force where it was made
            described = await admin_b.call(ApiKey.DESCRIBE_ACLS, 2, {
                "resource_type_filter": ResourceType.TOPIC, "resource_name_filter": TOPIC,
                "pattern_type_filter": PatternType.ANY, "principal_filter": None,
                "host_filter": None, "operation": AclOperation.ANY,
                "permission_type": AclPermission.ANY})
            assert [r["resource_name"] for r in described["resources"]] == [TOPIC]
            codes: list[int] = []

            async def allowed_on_b() -> bool:
                codes.append(await topic_code(bob_b))
                return codes[-1] == ErrorCode.NONE
            await eventually(allowed_on_b, timeout=POLL_INTERVAL * 3,
                             msg="broker-b enforces the binding made through broker-a")
            assert time.monotonic() - acked < POLL_INTERVAL * 2.5
            # and the other way round: a DENY made through broker-b refuses on broker-a
            answer = await admin_b.call(ApiKey.CREATE_ACLS, 2, {"creations": [
                creation(AclOperation.ALL, AclPermission.DENY)]})
            assert [r["error_code"] for r in answer["results"]] == [ErrorCode.NONE]

            async def refused_on_a() -> bool:
                return await topic_code(bob_a) == ErrorCode.TOPIC_AUTHORIZATION_FAILED
            await eventually(refused_on_a, timeout=POLL_INTERVAL * 3)
        finally:
            for wire in (bob_a, bob_b, admin_a, admin_b):
                wire.close()
        # neither users file was written: the bindings are etcd's
        for name in ("a-users.json", "b-users.json"):
            assert load_users(tmp_path / name).acls == ()


async def test_a_deleted_acl_stops_everywhere_and_etcd_away_refuses_a_change(
        broker_config: BrokerConfig, tmp_path: Path, etcd_cluster) -> None:
    """DeleteAcls through broker-b ends a binding made through broker-a on both; with two of
    three etcd members down CreateAcls and DeleteAcls answer an error, the brokers keep the
    bindings they last read, and nothing changes, even once etcd is back."""
    async with EtcdCluster(broker_config, tmp_path, etcd_cluster) as c:
        a, b = await two_groups(c, tmp_path)
        bob_a = await Wire.login(a.kafka_port, "bob")
        admin_a = await Wire.login(a.kafka_port, "alice")
        admin_b = await Wire.login(b.kafka_port, "alice")
        try:
            answer = await admin_a.call(ApiKey.CREATE_ACLS, 2,
                                        {"creations": [creation(AclOperation.READ)]})
            assert [r["error_code"] for r in answer["results"]] == [ErrorCode.NONE]
            assert await topic_code(bob_a) == ErrorCode.NONE
            gone = await admin_b.call(ApiKey.DELETE_ACLS, 2, {"filters": [{
                "resource_type_filter": ResourceType.TOPIC, "resource_name_filter": TOPIC,
                "pattern_type_filter": PatternType.LITERAL, "principal_filter": "User:bob",
                "host_filter": None, "operation": AclOperation.ANY,
                "permission_type": AclPermission.ANY}]})
            assert [len(r["matching_acls"]) for r in gone["filter_results"]] == [1]

            async def refused_on_a() -> bool:
                return await topic_code(bob_a) == ErrorCode.TOPIC_AUTHORIZATION_FAILED
            await eventually(refused_on_a, timeout=POLL_INTERVAL * 3,
                             msg="broker-a drops the binding deleted through broker-b")

            kept = await admin_b.call(ApiKey.CREATE_ACLS, 2, {"creations": [
                creation(AclOperation.WRITE)]})
            assert [r["error_code"] for r in kept["results"]] == [ErrorCode.NONE]

            async def allowed_on_a() -> bool:
                return await topic_code(bob_a) == ErrorCode.NONE
            await eventually(allowed_on_a, timeout=POLL_INTERVAL * 3)
            etcd_cluster.kill(1)
            etcd_cluster.kill(2)
            started = time.monotonic()
            answer = await admin_a.call(ApiKey.CREATE_ACLS, 2,
                                        {"creations": [creation(AclOperation.READ)]})
            assert [r["error_code"] for r in answer["results"]] == \
                [ErrorCode.UNKNOWN_SERVER_ERROR], answer
            assert "etcd" in answer["results"][0]["error_message"]
            gone = await admin_a.call(ApiKey.DELETE_ACLS, 2, {"filters": [{
                "resource_type_filter": ResourceType.TOPIC, "resource_name_filter": TOPIC,
                "pattern_type_filter": PatternType.ANY, "principal_filter": None,
                "host_filter": None, "operation": AclOperation.ANY,
                "permission_type": AclPermission.ANY}]})
            assert [(r["error_code"], r["matching_acls"]) for r in gone["filter_results"]] == \
                [(ErrorCode.UNKNOWN_SERVER_ERROR, [])], gone
            assert time.monotonic() - started < WAIT
            # the brokers keep what they last read: the WRITE binding still applies
            assert await topic_code(bob_a) == ErrorCode.NONE
            etcd_cluster.start_member(1)
            etcd_cluster.start_member(2)
        finally:
            for wire in (bob_a, admin_a, admin_b):
                wire.close()
        etcd = Etcd(parse_endpoints(etcd_cluster.endpoints), timeout=3.0)
        try:
            users, _ = await EtcdUsers(etcd, a.config.etcd_prefix, a.config.cluster_name).read()
        finally:
            await etcd.close()
        # neither the refused creation nor the refused deletion landed late
        assert [(b.operation, b.permission) for b in users.acls] == \
            [(AclOperation.WRITE, AclPermission.ALLOW)]


async def test_a_user_added_with_the_cli_on_etcd_logs_in_on_two_groups(
        broker_config: BrokerConfig, tmp_path: Path, etcd_cluster) -> None:
    """``txbroker user add --etcd-endpoints`` makes a user both groups' brokers accept at
    their next poll; ``user delete`` ends its logins everywhere; ``acl add`` lands in etcd."""
    async with EtcdCluster(broker_config, tmp_path, etcd_cluster) as c:
        a, b = await two_groups(c, tmp_path)
        assert not await logs_in(a.kafka_port, "dave", PASSWORDS["dave"])
        env = {"TXBROKER_ETCD_ENDPOINTS": etcd_cluster.endpoints}
        out = cli_ok(await run_cli("user", "add", "dave", "--role", "producer",
                                   "--password-stdin", env=env,
                                   input=PASSWORDS["dave"].encode() + b"\n"))
        assert out == "user dave added with role(s) producer\n"
        for broker in (a, b):
            async def dave_in(port: int = broker.kafka_port) -> bool:
                return await logs_in(port, "dave", PASSWORDS["dave"])
            await eventually(dave_in, timeout=POLL_INTERVAL * 3, msg="dave logs in")
        assert not await logs_in(b.kafka_port, "dave", "wrong")
        listed = cli_ok(await run_cli("user", "list", env=env))
        assert "dave  roles=producer  scram=SCRAM-SHA-256,SCRAM-SHA-512" in listed
        assert "alice  roles=admin" in listed  # imported from the first broker's file
        assert "dave-secret" not in listed
        cli_ok(await run_cli("acl", "add", "--allow-principal", "User:bob", "--operation",
                             "Describe", "--topic", TOPIC, env=env))
        bob_b = await Wire.login(b.kafka_port, "bob")
        try:
            async def bob_sees() -> bool:
                return await topic_code(bob_b) == ErrorCode.NONE
            await eventually(bob_sees, timeout=POLL_INTERVAL * 3)
        finally:
            bob_b.close()
        cli_ok(await run_cli("user", "delete", "dave", env=env))
        for broker in (a, b):
            async def dave_out(port: int = broker.kafka_port) -> bool:
                return not await logs_in(port, "dave", PASSWORDS["dave"])
            await eventually(dave_out, timeout=POLL_INTERVAL * 3, msg="dave is refused")
        # the users files were not touched
        assert "dave" not in load_users(tmp_path / "a-users.json").users


def _config(broker_config: BrokerConfig, etcd: LocalEtcd, **changes: object) -> BrokerConfig:
    return broker_config.replace(namesrv_addr="127.0.0.1:9876", etcd_endpoints=etcd.endpoints,
                                 **changes)


async def test_the_first_broker_imports_its_users_file_once(
        broker_config: BrokerConfig, tmp_path: Path, etcd_cluster) -> None:
    """The first store to find etcd without users imports its file (users and bindings) with
    ``users-imported``; a binding deleted since is not brought back by a later broker's file,
    and a file is never imported over an existing store."""
    binding = AclBinding(ResourceType.TOPIC, TOPIC, PatternType.LITERAL, "User:bob", "*",
                         AclOperation.READ, AclPermission.ALLOW)
    old = tmp_path / "old-users.json"
    write_users(old, load_users(users_file(tmp_path / "u.json")).with_acls([binding]))
    first = ClusterUsers(_config(broker_config, etcd_cluster, users_file=str(old)))
    await first.start()
    try:
        assert set(first.current().users) == {"alice", "bob"}
        assert first.current().acls == (binding,)
        assert first.current().scram_credentials("alice", MECH) == \
            load_users(old).scram_credentials("alice", MECH)
        await first.update(lambda users: users.without_acls(AclFilter()))
        assert first.current().acls == ()
        marker = await first.etcd.get(first.doc.marker)
        assert marker is not None and b'"users":2' in marker.value
    finally:
        await first.close()
    again = ClusterUsers(_config(broker_config, etcd_cluster, users_file=str(old),
                                 broker_name="broker-b"))
    await again.start()
    try:
        assert again.current().acls == ()  # the deleted binding stays deleted
        assert set(again.current().users) == {"alice", "bob"}
    finally:
        await again.close()


async def test_edits_at_once_from_two_stores_both_land(
        broker_config: BrokerConfig, tmp_path: Path, etcd_cluster) -> None:
    """Two brokers' edits racing on the one document: the compare-and-swap makes the later
    one apply to the earlier one's result, so every binding lands once."""
    stores = [ClusterUsers(_config(broker_config, etcd_cluster, broker_name=f"broker-{i}"))
              for i in range(2)]
    for s in stores:
        await s.start()
    try:
        bindings = [AclBinding(ResourceType.GROUP, f"g{i}", PatternType.LITERAL, "User:bob", "*",
                               AclOperation.READ, AclPermission.ALLOW) for i in range(10)]
        await asyncio.gather(*(stores[i % 2].update(lambda u, b=b: (u.with_acls([b]), None))
                               for i, b in enumerate(bindings)))
        got = await stores[0].fresh()
        assert sorted(got.acls, key=lambda b: b.name) == sorted(bindings, key=lambda b: b.name)
        await eventually(lambda: len(stores[1].current().acls) == 10,
                         timeout=POLL_INTERVAL * 3)
    finally:
        for s in stores:
            await s.close()


async def test_a_store_without_a_salt_key_gets_one_once_for_every_broker(
        broker_config: BrokerConfig, tmp_path: Path, etcd_cluster) -> None:
    """A document written before there was a ``salt_key`` (the key of unknown users' made-up
    SCRAM salts, docs/security.md "Kafka SASL"): the brokers starting on it agree on one key,
    added once, and keep it across a restart."""
    old = load_users(users_file(tmp_path / "u.json"))
    old = Users(old.users, old.acls)  # as written before the key existed
    assert not old.salt_key
    first = ClusterUsers(_config(broker_config, etcd_cluster, broker_name="broker-a"))
    assert await first.doc.import_file(old, "a test")
    stores = [first, ClusterUsers(_config(broker_config, etcd_cluster, broker_name="broker-b"))]
    await asyncio.gather(*(s.start() for s in stores))
    try:
        keys = [s.current().salt_key for s in stores]
        assert keys[0] and keys[0] == keys[1]
        assert set(stores[1].current().users) == {"alice", "bob"}
    finally:
        for s in stores:
            await s.close()
    again = ClusterUsers(_config(broker_config, etcd_cluster, broker_name="broker-a"))
    await again.start()
    try:
        assert again.current().salt_key == keys[0]
    finally:
        await again.close()


ACL = """\
accounts:
  - accessKey: operations
    secretKey: operations-secret
    admin: true
"""


async def test_an_access_key_made_with_the_cli_on_etcd_signs_on_two_groups(
        broker_config: BrokerConfig, tmp_path: Path, etcd_cluster) -> None:
    """The RocketMQ plain ACL of each group's broker takes the cluster's access keys: one made
    by ``txbroker user access-key --etcd-endpoints`` signs sends to both groups, and stops
    when its user is deleted."""
    from txbroker.client import Message, Producer
    from txbroker.client.errors import SendError

    acl_file = tmp_path / "plain_acl.yml"
    acl_file.write_text(ACL)
    env = {"TXBROKER_ETCD_ENDPOINTS": etcd_cluster.endpoints}
    cli_ok(await run_cli("user", "add", "erin", "--role", "producer", "--password-stdin",
                         env=env, input=b"erin-password\n"))
    out = cli_ok(await run_cli("user", "access-key", "erin", env=env))
    key = out.split("accessKey: ")[1].split()[0]
    secret = out.split("secretKey: ")[1].split()[0]
    async with EtcdCluster(broker_config, tmp_path, etcd_cluster) as c:
        await c.namesrv()
        a = await c.broker("broker-a", acl_file=str(acl_file))
        b = await c.broker("broker-b", acl_file=str(acl_file))
        await eventually(lambda: a.roles.is_master and b.roles.is_master, msg="both masters")
        await a.topics.create_or_update(TopicConfig("OnA", 1, 1))
        await b.topics.create_or_update(TopicConfig("OnB", 1, 1))

        async def send(topic: str, the_secret: str = secret) -> str | None:
            async with Producer("users-test", c.namesrv_addr, retries=0, access_key=key,
                                secret_key=the_secret) as producer:
                try:
                    await producer.send(Message(topic, b"from erin"))
                except SendError as exc:
                    return exc.remark
            return None
        outcomes: list[str | None] = []

        async def stored(topic: str) -> bool:
            outcomes.append(await send(topic))
            return outcomes[-1] is None
        for topic in ("OnA", "OnB"):
            await eventually(lambda topic=topic: stored(topic),
                             msg=lambda: f"send signed with erin's key: {outcomes[-1:]}")
        assert a.store.max_offset("OnA", 0) >= 1 and b.store.max_offset("OnB", 0) >= 1
        refused = await send("OnB", "not-the-secret")
        assert refused is not None and "Check signature failed" in refused
        cli_ok(await run_cli("user", "delete", "erin", env=env))

        async def refused_now() -> bool:
            outcomes.append(await send("OnA"))
            return outcomes[-1] is not None and f"No acl config for '{key}'" in outcomes[-1]
        await eventually(refused_now, timeout=POLL_INTERVAL * 5,
                         msg=lambda: f"send after delete: {outcomes[-1:]}")


def _auth(user: str) -> dict:
    return {"security_protocol": "SASL_PLAINTEXT", "sasl_mechanism": MECH,
            "sasl_plain_username": user, "sasl_plain_password": PASSWORDS[user]}


def _send_to_each_partition(bootstrap: str, topic: str, partitions: int) -> None:
    """bob sends one record to each partition (each led by another group's broker)."""
    from kafka import KafkaProducer

    producer = KafkaProducer(bootstrap_servers=bootstrap, max_block_ms=10_000, retries=0,
                             **_auth("bob"))
    try:
        for p in range(partitions):
            producer.send(topic, b"acl", partition=p).get(timeout=10)
    finally:
        producer.close(timeout=10)


async def test_kafka_python_admin_acls_apply_on_every_group(
        broker_config: BrokerConfig, tmp_path: Path, etcd_cluster) -> None:
    """kafka-python's KafkaAdminClient creates a binding on the cluster (whichever broker it
    asks); bob's producer then writes to a partition of each group, and once the admin
    client deleted the binding, to neither."""
    from kafka.admin import (
        ACL,
        ACLFilter,
        ACLOperation,
        ACLPermissionType,
        ACLResourcePatternType,
        KafkaAdminClient,
        ResourcePattern,
        ResourcePatternFilter,
    )
    from kafka.admin import ResourceType as KafkaResourceType
    from kafka.errors import TopicAuthorizationFailedError

    async with EtcdCluster(broker_config, tmp_path, etcd_cluster) as c:
        a, b = await two_groups(c, tmp_path)
        for broker in (a, b):
            await broker.topics.create_or_update(TopicConfig("spread", 1, 1))
        for broker in (a, b):
            await eventually(lambda broker=broker: len(broker.kafka_view.slots("spread")) == 2,
                             msg="views see both partitions")
        bootstrap = f"127.0.0.1:{a.kafka_port}"
        with pytest.raises(TopicAuthorizationFailedError):
            await asyncio.to_thread(_send_to_each_partition, bootstrap, "spread", 2)
        admin = await asyncio.to_thread(lambda: KafkaAdminClient(
            bootstrap_servers=bootstrap, request_timeout_ms=10_000, **_auth("alice")))
        try:
            write = ACL("User:bob", "*", ACLOperation.WRITE, ACLPermissionType.ALLOW,
                        ResourcePattern(KafkaResourceType.TOPIC, "spread",
                                        ACLResourcePatternType.LITERAL))
            result = await asyncio.to_thread(admin.create_acls, [write])
            assert result["failed"] == [] and len(result["succeeded"]) == 1
            errors: list[BaseException] = []

            async def both_take_it() -> bool:
                try:
                    await asyncio.to_thread(_send_to_each_partition, bootstrap, "spread", 2)
                except TopicAuthorizationFailedError as exc:
                    errors.append(exc)
                    return False
                return True
            await eventually(both_take_it, timeout=POLL_INTERVAL * 5,
                             msg=lambda: f"bob writes to both groups: {errors[-1:]}")
            assert a.store.max_offset("spread", 0) >= 1 and b.store.max_offset("spread", 0) >= 1
            everything = ACLFilter("User:bob", None, ACLOperation.ANY, ACLPermissionType.ANY,
                                   ResourcePatternFilter(KafkaResourceType.ANY, None,
                                                         ACLResourcePatternType.ANY))
            deleted = await asyncio.to_thread(admin.delete_acls, [everything])
            assert [len(matches) for _f, matches, _e in deleted] == [1]
        finally:
            await asyncio.to_thread(admin.close)

        async def neither_takes_it() -> bool:
            try:
                await asyncio.to_thread(_send_to_each_partition, bootstrap, "spread", 2)
            except TopicAuthorizationFailedError:
                return True
            return False
        await eventually(neither_takes_it, timeout=POLL_INTERVAL * 5)


async def test_txbroker_user_import_makes_the_store_once(tmp_path: Path, etcd_cluster) -> None:
    """``txbroker user import FILE --etcd-endpoints`` writes the file as the cluster's store
    when it was never made; a second import, or one after an edit made the store, is refused
    with one line and changes nothing."""
    from support.cli_runner import cli_one_line_error

    source = users_file(tmp_path / "old.json")
    env = {"TXBROKER_ETCD_ENDPOINTS": etcd_cluster.endpoints}
    out = cli_ok(await run_cli("user", "import", source, env=env))
    assert out == (f"imported 2 user(s) and 0 Kafka ACL binding(s) from {source} into etcd "
                   f"/txbroker/DefaultCluster/users\n")
    cli_ok(await run_cli("user", "delete", "bob", env=env))
    err = cli_one_line_error(await run_cli("user", "import", source, env=env))
    assert "exists already" in err
    listed = cli_ok(await run_cli("user", "list", env=env))
    assert "bob" not in listed and "alice  roles=admin" in listed
    err = cli_one_line_error(await run_cli("user", "import", source))
    assert "needs --etcd-endpoints" in err
