"""Kafka ACLs on the wire (raw frames through real sockets to an in-process broker with SASL):
per resource type, a user without the permission is refused with Kafka's error code and
nothing is stored, then allowed once the binding is added through CreateAcls (from an admin
user) or ``txbroker acl add``; DescribeAcls / DeleteAcls; and with SASL off, no ACL applies."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from support.cli_runner import cli_ok, run_cli
from support.kafka_sasl import users_file
from test_kafka_sasl import Wire

from txbroker.config import BrokerConfig
from txbroker.remoting.kafka.apis import ApiKey
from txbroker.remoting.kafka.errors import ErrorCode
from txbroker.remoting.kafka.records import Record, encode_batch
from txbroker.service.kafka.acls import AclOperation, PatternType, ResourceType
from txbroker.service.topics import TopicConfig
from txbroker.service.users import edit_users, load_users

MECH = "SCRAM-SHA-256"
ADMIN, BOB = "alice", "bob"
PASSWORDS = {ADMIN: "alice-secret", BOB: "bob-secret", "carol": "carol-secret"}
TOPIC = "acl-topic"


@pytest.fixture
def acl_config(kafka_config: BrokerConfig, tmp_path: Path) -> BrokerConfig:
    path = users_file(tmp_path / "users.json", **PASSWORDS)
    with edit_users(path) as box:  # alice is an admin; bob has nothing; carol produces
        box[0] = box[0].with_password(ADMIN, PASSWORDS[ADMIN], ("admin",)).with_password(
            "carol", PASSWORDS["carol"], ("producer",))
    return kafka_config.replace(kafka_sasl_mechanisms=MECH, users_file=path)


@pytest.fixture
async def acl_broker(acl_config: BrokerConfig):
    from txbroker.broker import Broker

    b = Broker(acl_config)
    await b.start()
    await b.topics.create_or_update(TopicConfig(TOPIC, 1, 1))
    try:
        yield b
    finally:
        await b.stop()


async def _login(broker, user: str) -> Wire:
    wire = await Wire.open(broker.kafka_port)
    answer = await wire.scram(MECH, user, PASSWORDS[user])
    assert answer["error_code"] == ErrorCode.NONE, answer
    return wire


def _produce(topic: str, transactional_id: str | None = None) -> dict:
    now = int(time.time() * 1000)
    batch = encode_batch(0, [Record(0, now, None, b"v", [])])
    return {"transactional_id": transactional_id, "acks": -1, "timeout_ms": 5000,
            "topic_data": [{"name": topic, "partition_data": [{"index": 0, "records": batch}]}]}


def _creation(kind: ResourceType, name: str, op: AclOperation, principal: str = f"User:{BOB}",
              pattern: PatternType = PatternType.LITERAL) -> dict:
    return {"resource_type": kind, "resource_name": name, "resource_pattern_type": pattern,
            "principal": principal, "host": "*", "operation": op, "permission_type": 3}


async def _create_acls(broker, *creations: dict, version: int = 2) -> list[int]:
    admin = await _login(broker, ADMIN)
    try:
        answer = await admin.call(ApiKey.CREATE_ACLS, version, {"creations": list(creations)})
        return [r["error_code"] for r in answer["results"]]
    finally:
        admin.close()


def _codes(answer: dict, topics_key: str, parts_key: str, code_key: str = "error_code") -> list:
    return [p[code_key] for t in answer[topics_key] for p in t[parts_key]]


async def test_produce_needs_write_on_the_topic(acl_broker) -> None:
    wire = await _login(acl_broker, BOB)
    try:
        answer = await wire.call(ApiKey.PRODUCE, 7, _produce(TOPIC))
        assert _codes(answer, "responses", "partition_responses") == \
            [ErrorCode.TOPIC_AUTHORIZATION_FAILED]
        assert acl_broker.store.max_offset(TOPIC, 0) == 0  # nothing stored
        assert await _create_acls(acl_broker, _creation(
            ResourceType.TOPIC, "acl-", AclOperation.WRITE, pattern=PatternType.PREFIXED)) == [0]
        answer = await wire.call(ApiKey.PRODUCE, 7, _produce(TOPIC))
        assert _codes(answer, "responses", "partition_responses") == [ErrorCode.NONE]
        assert acl_broker.store.max_offset(TOPIC, 0) == 1
        # a transactional produce needs WRITE on its transactional id too
        answer = await wire.call(ApiKey.PRODUCE, 7, _produce(TOPIC, "tx-1"))
        assert _codes(answer, "responses", "partition_responses") == \
            [ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED]
        assert acl_broker.store.max_offset(TOPIC, 0) == 1
        # fetch needs READ, which WRITE does not give
        fetch = await wire.call(ApiKey.FETCH, 4, {
            "max_wait_ms": 0, "min_bytes": 1, "max_bytes": 1 << 20, "isolation_level": 0,
            "topics": [{"topic": TOPIC, "partitions": [{"partition": 0, "fetch_offset": 0,
                                                         "partition_max_bytes": 1 << 20}]}]})
        assert _codes(fetch, "responses", "partitions") == [ErrorCode.TOPIC_AUTHORIZATION_FAILED]
    finally:
        wire.close()


async def test_metadata_hides_or_refuses_topics_bob_may_not_describe(acl_broker) -> None:
    wire = await _login(acl_broker, BOB)
    try:
        every = await wire.call(ApiKey.METADATA, 1, {"topics": None})
        assert every["brokers"] and every["topics"] == []
        named = await wire.call(ApiKey.METADATA, 4, {"topics": [{"name": TOPIC}, {"name": "new"}],
                                                     "allow_auto_topic_creation": True})
        assert {t["name"]: t["error_code"] for t in named["topics"]} == {
            TOPIC: ErrorCode.TOPIC_AUTHORIZATION_FAILED, "new": ErrorCode.TOPIC_AUTHORIZATION_FAILED}
        assert acl_broker.topics.get("new") is None  # not created
        await _create_acls(acl_broker, _creation(ResourceType.TOPIC, "*", AclOperation.DESCRIBE))
        named = await wire.call(ApiKey.METADATA, 4, {"topics": [{"name": TOPIC}, {"name": "new"}],
                                                     "allow_auto_topic_creation": True})
        assert {t["name"]: t["error_code"] for t in named["topics"]} == {
            TOPIC: ErrorCode.NONE, "new": ErrorCode.UNKNOWN_TOPIC_OR_PARTITION}
        assert acl_broker.topics.get("new") is None  # DESCRIBE alone creates nothing
        every = await wire.call(ApiKey.METADATA, 1, {"topics": None})
        assert TOPIC in [t["name"] for t in every["topics"]]
    finally:
        wire.close()


async def test_groups_need_read_on_the_group(acl_broker, acl_config: BrokerConfig) -> None:
    wire = await _login(acl_broker, BOB)
    commit = {"group_id": "g1", "generation_id_or_member_epoch": -1, "member_id": "",
              "topics": [{"name": TOPIC, "partitions": [
                  {"partition_index": 0, "committed_offset": 1, "committed_metadata": ""}]}]}
    join = {"group_id": "g1", "session_timeout_ms": 10000, "rebalance_timeout_ms": 10000,
            "member_id": "", "protocol_type": "consumer",
            "protocols": [{"name": "range", "metadata": b""}]}
    try:
        answer = await wire.call(ApiKey.JOIN_GROUP, 2, join)
        assert answer["error_code"] == ErrorCode.GROUP_AUTHORIZATION_FAILED
        assert "g1" not in acl_broker.groups.groups
        answer = await wire.call(ApiKey.OFFSET_COMMIT, 2, commit)
        assert _codes(answer, "topics", "partitions") == [ErrorCode.GROUP_AUTHORIZATION_FAILED]
        assert acl_broker.store.offsets.get("g1", TOPIC, 0) is None
        coordinator = await wire.call(ApiKey.FIND_COORDINATOR, 1, {"key": "g1", "key_type": 0})
        assert coordinator["error_code"] == ErrorCode.GROUP_AUTHORIZATION_FAILED
        # the group through the CLI: the commit still needs READ on the topic
        cli_ok(await run_cli("acl", "add", "--allow-principal", f"User:{BOB}", "--operation",
                             "Read", "--group", "g1", "--users-file", acl_config.users_file))
        acl_broker.users.refresh()
        answer = await wire.call(ApiKey.OFFSET_COMMIT, 2, commit)
        assert _codes(answer, "topics", "partitions") == [ErrorCode.TOPIC_AUTHORIZATION_FAILED]
        assert acl_broker.store.offsets.get("g1", TOPIC, 0) is None
        cli_ok(await run_cli("acl", "add", "--allow-principal", f"User:{BOB}", "--operation",
                             "Read", "--topic", TOPIC, "--users-file", acl_config.users_file))
        acl_broker.users.refresh()
        answer = await wire.call(ApiKey.OFFSET_COMMIT, 2, commit)
        assert _codes(answer, "topics", "partitions") == [ErrorCode.NONE]
        assert acl_broker.store.offsets.get("g1", TOPIC, 0) == 1
        answer = await wire.call(ApiKey.JOIN_GROUP, 2, join)
        assert answer["error_code"] == ErrorCode.NONE
    finally:
        wire.close()


async def test_init_producer_id_needs_the_transactional_id_or_idempotent_write(
        acl_broker) -> None:
    wire = await _login(acl_broker, BOB)
    txn = {"transactional_id": "tx-1", "transaction_timeout_ms": 60000}
    idem = {"transactional_id": None, "transaction_timeout_ms": 60000}
    try:
        answer = await wire.call(ApiKey.INIT_PRODUCER_ID, 1, txn)
        assert answer["error_code"] == ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
        assert answer["producer_id"] == -1
        assert acl_broker.kafka_txn.describe("tx-1") is None  # no state made for it
        answer = await wire.call(ApiKey.INIT_PRODUCER_ID, 1, idem)
        assert answer["error_code"] == ErrorCode.CLUSTER_AUTHORIZATION_FAILED
        assert await _create_acls(
            acl_broker, _creation(ResourceType.TRANSACTIONAL_ID, "tx-1", AclOperation.WRITE),
            _creation(ResourceType.CLUSTER, "kafka-cluster", AclOperation.IDEMPOTENT_WRITE)) \
            == [0, 0]
        answer = await wire.call(ApiKey.INIT_PRODUCER_ID, 1, txn)
        assert answer["error_code"] == ErrorCode.NONE and answer["producer_id"] >= 0
        answer = await wire.call(ApiKey.INIT_PRODUCER_ID, 1, idem)
        assert answer["error_code"] == ErrorCode.NONE and answer["producer_id"] >= 0
    finally:
        wire.close()


async def test_acl_apis_need_the_cluster_and_nothing_is_stored(acl_broker,
                                                               acl_config: BrokerConfig) -> None:
    wire = await _login(acl_broker, BOB)
    try:
        answer = await wire.call(ApiKey.CREATE_ACLS, 1, {"creations": [
            _creation(ResourceType.TOPIC, "*", AclOperation.ALL)]})
        assert [r["error_code"] for r in answer["results"]] == \
            [ErrorCode.CLUSTER_AUTHORIZATION_FAILED]
        assert load_users(acl_config.users_file).acls == ()
        answer = await wire.call(ApiKey.DESCRIBE_ACLS, 1, {
            "resource_type_filter": 1, "pattern_type_filter": 1, "operation": 1,
            "permission_type": 1})
        assert answer["error_code"] == ErrorCode.CLUSTER_AUTHORIZATION_FAILED
        answer = await wire.call(ApiKey.DELETE_ACLS, 1, {"filters": [{
            "resource_type_filter": 1, "pattern_type_filter": 1, "operation": 1,
            "permission_type": 1}]})
        assert answer["filter_results"][0]["error_code"] == ErrorCode.CLUSTER_AUTHORIZATION_FAILED
    finally:
        wire.close()


@pytest.mark.parametrize("version", [1, 2, 3])
async def test_create_describe_delete_acls(acl_broker, acl_config: BrokerConfig,
                                           version: int) -> None:
    admin = await _login(acl_broker, ADMIN)
    try:
        answer = await admin.call(ApiKey.CREATE_ACLS, version, {"creations": [
            _creation(ResourceType.TOPIC, "orders", AclOperation.READ),
            _creation(ResourceType.GROUP, "g-", AclOperation.READ, pattern=PatternType.PREFIXED),
            _creation(ResourceType.TOPIC, "x", AclOperation.READ, principal="bob"),  # bad
            _creation(ResourceType.CLUSTER, "other", AclOperation.ALTER)]})  # bad
        codes = [r["error_code"] for r in answer["results"]]
        assert codes == [0, 0, ErrorCode.INVALID_REQUEST, ErrorCode.INVALID_REQUEST]
        assert "User:<name>" in answer["results"][2]["error_message"]
        assert len(load_users(acl_config.users_file).acls) == 2
        any_filter = {"resource_type_filter": 1, "resource_name_filter": None,
                      "pattern_type_filter": 1, "principal_filter": None, "host_filter": None,
                      "operation": 1, "permission_type": 1}
        answer = await admin.call(ApiKey.DESCRIBE_ACLS, version, any_filter)
        assert answer["error_code"] == 0
        assert sorted((r["resource_type"], r["resource_name"], r["pattern_type"],
                       [a["principal"] for a in r["acls"]]) for r in answer["resources"]) == [
            (2, "orders", 3, ["User:bob"]), (3, "g-", 4, ["User:bob"])]
        matching = await admin.call(ApiKey.DESCRIBE_ACLS, version, {
            **any_filter, "resource_type_filter": 3, "resource_name_filter": "g-1",
            "pattern_type_filter": 2})
        assert [r["resource_name"] for r in matching["resources"]] == ["g-"]
        bad = await admin.call(ApiKey.DESCRIBE_ACLS, version, {**any_filter,
                                                                 "resource_type_filter": 0})
        assert bad["error_code"] == ErrorCode.INVALID_REQUEST
        answer = await admin.call(ApiKey.DELETE_ACLS, version, {"filters": [
            {**any_filter, "resource_type_filter": 2}, {**any_filter, "operation": 0}]})
        first, second = answer["filter_results"]
        assert first["error_code"] == 0
        assert [(m["resource_name"], m["operation"]) for m in first["matching_acls"]] == \
            [("orders", AclOperation.READ)]
        assert second["error_code"] == ErrorCode.INVALID_REQUEST
        assert [b.name for b in load_users(acl_config.users_file).acls] == ["g-"]
    finally:
        admin.close()


async def test_v0_acl_apis_are_about_literal_bindings(acl_broker, acl_config: BrokerConfig) -> None:
    """v0 (Kafka 3.9's; Kafka 4 serves from 1, sarama 1.22 sends 0) names no pattern type:
    Kafka reads LITERAL, so a v0 creation is literal and v0 filters see and delete only
    literal bindings."""
    admin = await _login(acl_broker, ADMIN)
    try:
        v0 = {k: v for k, v in _creation(ResourceType.TOPIC, "orders", AclOperation.READ).items()
              if k != "resource_pattern_type"}
        answer = await admin.call(ApiKey.CREATE_ACLS, 0, {"creations": [v0]})
        assert [r["error_code"] for r in answer["results"]] == [0]
        assert await _create_acls(acl_broker, _creation(
            ResourceType.TOPIC, "ord", AclOperation.READ, pattern=PatternType.PREFIXED)) == [0]
        assert sorted((b.name, b.pattern) for b in load_users(acl_config.users_file).acls) == [
            ("ord", PatternType.PREFIXED), ("orders", PatternType.LITERAL)]
        topics = {"resource_type_filter": 2, "resource_name_filter": None, "principal_filter": None,
                  "host_filter": None, "operation": 1, "permission_type": 1}
        answer = await admin.call(ApiKey.DESCRIBE_ACLS, 0, topics)
        assert answer["error_code"] == 0
        assert [(r["resource_name"], [a["principal"] for a in r["acls"]])
                for r in answer["resources"]] == [("orders", [f"User:{BOB}"])]
        answer = await admin.call(ApiKey.DELETE_ACLS, 0, {"filters": [topics]})
        assert [m["resource_name"] for m in answer["filter_results"][0]["matching_acls"]] == ["orders"]
        assert [(b.name, b.pattern) for b in load_users(acl_config.users_file).acls] == [
            ("ord", PatternType.PREFIXED)]
    finally:
        admin.close()


async def test_a_deny_binding_narrows_a_role(acl_broker) -> None:
    wire = await _login(acl_broker, "carol")  # producer: WRITE on every topic
    try:
        answer = await wire.call(ApiKey.PRODUCE, 7, _produce(TOPIC))
        assert _codes(answer, "responses", "partition_responses") == [ErrorCode.NONE]
        await _create_acls(acl_broker, {**_creation(ResourceType.TOPIC, TOPIC, AclOperation.WRITE,
                                                    principal="User:*"), "permission_type": 2})
        answer = await wire.call(ApiKey.PRODUCE, 7, _produce(TOPIC))
        assert _codes(answer, "responses", "partition_responses") == \
            [ErrorCode.TOPIC_AUTHORIZATION_FAILED]
        assert acl_broker.store.max_offset(TOPIC, 0) == 1
    finally:
        wire.close()


async def test_without_sasl_no_acl_applies_and_the_acl_apis_are_disabled(kafka_broker) -> None:
    await kafka_broker.topics.create_or_update(TopicConfig(TOPIC, 1, 1))
    wire = await Wire.open(kafka_broker.kafka_port)
    try:
        answer = await wire.call(ApiKey.PRODUCE, 7, _produce(TOPIC))
        assert _codes(answer, "responses", "partition_responses") == [ErrorCode.NONE]
        answer = await wire.call(ApiKey.DESCRIBE_ACLS, 1, {
            "resource_type_filter": 1, "pattern_type_filter": 1, "operation": 1,
            "permission_type": 1})
        assert answer["error_code"] == ErrorCode.SECURITY_DISABLED
    finally:
        wire.close()


def _top(answer: dict) -> list:
    return [answer["error_code"]]


def _each(key: str, code_key: str = "error_code"):
    return lambda answer: [e[code_key] for e in answer[key]]


_PARTS = [{"name": TOPIC, "partitions": [{"partition_index": 0, "committed_offset": 1}]}]
TX = {"transactional_id": "tx-1", "producer_id": 1, "producer_epoch": 0}

# Every checked API, as a user with no binding and no role sends it: (api, version, body,
# the error codes of the answer, the code expected for each).
REFUSED = [
    (ApiKey.LIST_OFFSETS, 2, {"topics": [{"name": TOPIC, "partitions": [
        {"partition_index": 0, "timestamp": -1}]}]},
     lambda a: _codes(a, "topics", "partitions"), ErrorCode.TOPIC_AUTHORIZATION_FAILED),
    (ApiKey.OFFSET_FETCH, 3, {"group_id": "g", "topics": None}, _top,
     ErrorCode.GROUP_AUTHORIZATION_FAILED),
    (ApiKey.FIND_COORDINATOR, 1, {"key": "tx-1", "key_type": 1}, _top,
     ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED),
    (ApiKey.SYNC_GROUP, 1, {"group_id": "g", "generation_id": 1, "member_id": "m",
                            "assignments": []}, _top, ErrorCode.GROUP_AUTHORIZATION_FAILED),
    (ApiKey.HEARTBEAT, 1, {"group_id": "g", "generation_id": 1, "member_id": "m"}, _top,
     ErrorCode.GROUP_AUTHORIZATION_FAILED),
    (ApiKey.LEAVE_GROUP, 1, {"group_id": "g", "member_id": "m"}, _top,
     ErrorCode.GROUP_AUTHORIZATION_FAILED),
    (ApiKey.DESCRIBE_GROUPS, 5, {"groups": ["g", "h"]}, _each("groups"),
     ErrorCode.GROUP_AUTHORIZATION_FAILED),
    (ApiKey.DELETE_GROUPS, 2, {"groups_names": ["g"]}, _each("results"),
     ErrorCode.GROUP_AUTHORIZATION_FAILED),
    (ApiKey.CREATE_TOPICS, 4, {"topics": [{"name": "made", "num_partitions": 1,
                                           "replication_factor": 1}], "timeout_ms": 1000},
     _each("topics"), ErrorCode.TOPIC_AUTHORIZATION_FAILED),
    (ApiKey.DELETE_TOPICS, 5, {"topic_names": [TOPIC], "timeout_ms": 1000}, _each("responses"),
     ErrorCode.TOPIC_AUTHORIZATION_FAILED),
    (ApiKey.CREATE_PARTITIONS, 3, {"topics": [{"name": TOPIC, "count": 4, "assignments": None}],
                                   "timeout_ms": 1000}, _each("results"),
     ErrorCode.TOPIC_AUTHORIZATION_FAILED),
    (ApiKey.DESCRIBE_CONFIGS, 4, {"resources": [
        {"resource_type": 2, "resource_name": TOPIC, "configuration_keys": None}]},
     _each("results"), ErrorCode.TOPIC_AUTHORIZATION_FAILED),
    (ApiKey.INCREMENTAL_ALTER_CONFIGS, 1, {"resources": [
        {"resource_type": 4, "resource_name": "0", "configs": []}]}, _each("responses"),
     ErrorCode.CLUSTER_AUTHORIZATION_FAILED),
    (ApiKey.ALTER_CONFIGS, 2, {"resources": [
        {"resource_type": 2, "resource_name": TOPIC, "configs": [
            {"name": "retention.ms", "value": "1"}]}]}, _each("responses"),
     ErrorCode.TOPIC_AUTHORIZATION_FAILED),
    (ApiKey.DESCRIBE_PRODUCERS, 0, {"topics": [{"name": TOPIC, "partition_indexes": [0]}]},
     lambda a: _codes(a, "topics", "partitions"), ErrorCode.TOPIC_AUTHORIZATION_FAILED),
    (ApiKey.ADD_PARTITIONS_TO_TXN, 2, {**TX, "topics": [{"name": TOPIC, "partitions": [0]}]},
     lambda a: _codes(a, "results", "results", "partition_error_code"),
     ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED),
    (ApiKey.ADD_OFFSETS_TO_TXN, 2, {**TX, "group_id": "g"}, _top,
     ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED),
    (ApiKey.END_TXN, 2, {**TX, "committed": True}, _top,
     ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED),
    (ApiKey.TXN_OFFSET_COMMIT, 2, {**TX, "group_id": "g", "topics": _PARTS},
     lambda a: _codes(a, "topics", "partitions"), ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED),
    (ApiKey.DESCRIBE_TRANSACTIONS, 0, {"transactional_ids": ["tx-1"]},
     _each("transaction_states"), ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED),
    # Only brokers send markers (a user's would settle another producer's transaction).
    (ApiKey.WRITE_TXN_MARKERS, 1, {"markers": [
        {"producer_id": 1, "producer_epoch": 0, "transaction_result": True,
         "coordinator_epoch": 1, "topics": [{"name": TOPIC, "partition_indexes": [0]}]}]},
     lambda a: [p["error_code"] for m in a["markers"] for t in m["topics"]
                for p in t["partitions"]], ErrorCode.CLUSTER_AUTHORIZATION_FAILED),
]


@pytest.mark.parametrize("key, version, body, codes, expected", REFUSED,
                         ids=[ApiKey(r[0]).name for r in REFUSED])
async def test_every_checked_api_refuses_a_user_without_permission(acl_broker, key, version,
                                                                   body, codes,
                                                                   expected) -> None:
    wire = await _login(acl_broker, BOB)
    try:
        got = codes(await wire.call(key, version, body))
        assert got and set(got) == {expected}, got
        # the connection stays usable after a refusal
        assert (await wire.call(ApiKey.API_VERSIONS, 0, {}))["error_code"] == 0
    finally:
        wire.close()
    assert acl_broker.topics.get("made") is None
    assert acl_broker.topics.get(TOPIC).read_queue_nums == 1  # not deleted, not grown


async def test_listings_leave_out_what_the_user_may_not_describe(acl_broker) -> None:
    admin = await _login(acl_broker, ADMIN)
    try:  # a simple commit makes group "g" known
        await admin.call(ApiKey.OFFSET_COMMIT, 2, {"group_id": "g", "member_id": "",
                                                   "topics": _PARTS})
        assert [g["group_id"] for g in (await admin.call(ApiKey.LIST_GROUPS, 2, {}))["groups"]] \
            == ["g"]
    finally:
        admin.close()
    wire = await _login(acl_broker, BOB)
    try:
        assert (await wire.call(ApiKey.LIST_GROUPS, 2, {}))["groups"] == []
        assert (await wire.call(ApiKey.LIST_TRANSACTIONS, 0, {}))["transaction_states"] == []
        await _create_acls(acl_broker, _creation(ResourceType.GROUP, "g", AclOperation.READ))
        answer = await wire.call(ApiKey.OFFSET_FETCH, 3, {"group_id": "g", "topics": None})
        assert answer["error_code"] == 0 and answer["topics"] == []  # TOPIC not described
        assert [g["group_id"] for g in (await wire.call(ApiKey.LIST_GROUPS, 2, {}))["groups"]] \
            == ["g"]  # READ implies DESCRIBE
    finally:
        wire.close()


async def test_a_mixed_request_serves_what_is_allowed(acl_broker) -> None:
    await acl_broker.topics.create_or_update(TopicConfig("open", 1, 1))
    await _create_acls(acl_broker, _creation(ResourceType.TOPIC, "open", AclOperation.WRITE))
    wire = await _login(acl_broker, BOB)
    try:
        body = _produce("open")
        body["topic_data"] += _produce(TOPIC)["topic_data"]
        answer = await wire.call(ApiKey.PRODUCE, 7, body)
        assert {t["name"]: t["partition_responses"][0]["error_code"]
                for t in answer["responses"]} == {
            "open": ErrorCode.NONE, TOPIC: ErrorCode.TOPIC_AUTHORIZATION_FAILED}
        assert acl_broker.store.max_offset("open", 0) == 1
        assert acl_broker.store.max_offset(TOPIC, 0) == 0
    finally:
        wire.close()


async def test_create_on_the_cluster_allows_every_topic(acl_broker) -> None:
    body = {"topics": [{"name": "made", "num_partitions": 1, "replication_factor": 1}],
            "timeout_ms": 1000}
    wire = await _login(acl_broker, BOB)
    try:
        answer = await wire.call(ApiKey.CREATE_TOPICS, 4, body)
        assert answer["topics"][0]["error_code"] == ErrorCode.TOPIC_AUTHORIZATION_FAILED
        await _create_acls(acl_broker, _creation(ResourceType.CLUSTER, "kafka-cluster",
                                                 AclOperation.CREATE))
        answer = await wire.call(ApiKey.CREATE_TOPICS, 4, body)
        assert answer["topics"][0]["error_code"] == ErrorCode.NONE
        assert acl_broker.topics.get("made") is not None
    finally:
        wire.close()


@pytest.mark.parametrize("secret", [None, "cluster-s3cret"])
async def test_a_client_claiming_to_be_a_broker_gets_no_exemption(acl_config, secret) -> None:
    """The cluster's client id without a valid signature (or without any cluster secret, where
    there is no signature to check) is still authorized as the user it logged in as."""
    from txbroker.broker import Broker
    from txbroker.remoting.kafka.framing import decode_response, encode_request
    from txbroker.service.cluster_auth import CLUSTER_ACCESS_KEY

    broker = Broker(acl_config.replace(cluster_secret=secret))
    await broker.start()
    try:
        await broker.topics.create_or_update(TopicConfig(TOPIC, 1, 1))
        wire = await _login(broker, BOB)
        try:
            for key, version, body in [
                    (ApiKey.PRODUCE, 7, _produce(TOPIC)),
                    (ApiKey.DELETE_TOPICS, 5, {"topic_names": [TOPIC], "timeout_ms": 1000})]:
                client_id = CLUSTER_ACCESS_KEY  # what a broker sends without a secret
                wire.corr += 1
                wire.writer.write(encode_request(key, version, wire.corr, client_id, body))
                _, answer = decode_response(key, version, await wire.frame())
                codes = [p["error_code"] for t in answer.get("responses", ())
                         for p in t.get("partition_responses", [t])]
                assert codes == [ErrorCode.TOPIC_AUTHORIZATION_FAILED], (key, answer)
        finally:
            wire.close()
        assert broker.store.max_offset(TOPIC, 0) == 0 and broker.topics.get(TOPIC) is not None
    finally:
        await broker.stop()


async def test_a_captured_broker_request_sent_over_a_user_login_gets_no_exemption(
        acl_config) -> None:
    """A forwarded DeleteTopics whose envelope checks (signed with the cluster secret, fresh,
    never seen here: one taken off the wire before it arrived) sent by a logged-in user
    without DELETE on the topic: refused, the topic kept.  Brokers log in as the cluster's
    own account; a request of theirs over anyone else's login is not theirs."""
    from txbroker.broker import Broker
    from txbroker.remoting.kafka.framing import decode_response, encode_request
    from txbroker.service.kafka.peer_envelope import client_id

    secret = "cluster-s3cret-cluster-s3cret-00"
    broker = Broker(acl_config.replace(cluster_secret=secret))
    await broker.start()
    try:
        await broker.topics.create_or_update(TopicConfig(TOPIC, 1, 1))
        body = {"topic_names": [TOPIC], "timeout_ms": 1000}
        captured = client_id(ApiKey.DELETE_TOPICS, 5, body, secret,
                             to=broker.config.broker_name)
        wire = await _login(broker, BOB)
        try:
            wire.corr += 1
            wire.writer.write(encode_request(ApiKey.DELETE_TOPICS, 5, wire.corr, captured, body))
            _, answer = decode_response(ApiKey.DELETE_TOPICS, 5, await wire.frame())
        finally:
            wire.close()
        assert [r["error_code"] for r in answer["responses"]] \
            == [ErrorCode.TOPIC_AUTHORIZATION_FAILED], answer
        assert broker.topics.get(TOPIC) is not None
    finally:
        await broker.stop()
