"""Kafka ACLs with real clients against a broker process: kafka-python's KafkaAdminClient
creates, lists and deletes bindings (CreateAcls / DescribeAcls / DeleteAcls at the versions
it picks from ApiVersions), and a producer refused TOPIC_AUTHORIZATION_FAILED succeeds once
its binding exists."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
from support.kafka_sasl import users_file

from txbroker.service.users import edit_users, load_users

pytestmark = pytest.mark.slow

TIMEOUT = 30
MECH = "SCRAM-SHA-512"
PASSWORDS = {"alice": "alice-secret", "bob": "bob-secret"}


def _auth(user: str) -> dict:
    return {"security_protocol": "SASL_PLAINTEXT", "sasl_mechanism": MECH,
            "sasl_plain_username": user, "sasl_plain_password": PASSWORDS[user]}


@pytest.fixture
def acl_process(broker_process, tmp_path: Path):
    path = users_file(tmp_path / "users.json", **PASSWORDS)
    with edit_users(path) as box:
        box[0] = box[0].with_password("alice", PASSWORDS["alice"], ("admin",))
    proc = broker_process(kafka_port=0, kafka_sasl_mechanisms=MECH, users_file=path)
    proc.users_file = path
    return proc


def _send(bootstrap: str, topic: str) -> None:
    from kafka import KafkaProducer

    producer = KafkaProducer(bootstrap_servers=bootstrap, max_block_ms=TIMEOUT * 1000,
                             retries=0, **_auth("bob"))
    try:
        producer.send(topic, b"acl").get(timeout=TIMEOUT)
    finally:
        producer.close(timeout=10)


def test_kafka_python_admin_client_manages_acls(acl_process) -> None:
    from kafka.admin import (
        ACL,
        ACLFilter,
        ACLOperation,
        ACLPermissionType,
        ACLResourcePatternType,
        KafkaAdminClient,
        NewTopic,
        ResourcePattern,
        ResourcePatternFilter,
        ResourceType,
    )
    from kafka.errors import TopicAuthorizationFailedError

    bootstrap = acl_process.kafka_addr
    topic = f"acl-{uuid.uuid4().hex[:6]}"
    admin = KafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=TIMEOUT * 1000,
                             **_auth("alice"))
    try:
        admin.create_topics([NewTopic(topic, 1, 1)])
        with pytest.raises(TopicAuthorizationFailedError):
            _send(bootstrap, topic)
        write = ACL("User:bob", "*", ACLOperation.WRITE, ACLPermissionType.ALLOW,
                    ResourcePattern(ResourceType.TOPIC, "acl-", ACLResourcePatternType.PREFIXED))
        result = admin.create_acls([write])
        assert result["failed"] == [] and len(result["succeeded"]) == 1
        assert [b.name for b in load_users(acl_process.users_file).acls] == ["acl-"]
        _send(bootstrap, topic)  # allowed now (DESCRIBE comes with WRITE)
        everything = ACLFilter(None, None, ACLOperation.ANY, ACLPermissionType.ANY,
                               ResourcePatternFilter(ResourceType.ANY, None,
                                                     ACLResourcePatternType.ANY))
        acls, error = admin.describe_acls(everything)
        assert error.errno == 0
        assert [(a.principal, a.operation, a.resource_pattern.resource_name) for a in acls] == \
            [("User:bob", ACLOperation.WRITE, "acl-")]
        deleted = admin.delete_acls([everything])
        assert len(deleted[0][1]) == 1
        assert load_users(acl_process.users_file).acls == ()
    finally:
        admin.close()


def test_confluent_kafka_admin_client_manages_acls(acl_process) -> None:
    """librdkafka's AdminClient (CreateAcls / DescribeAcls / DeleteAcls at the versions it
    picks); its producer refused TOPIC_AUTHORIZATION_FAILED until the topic's binding exists."""
    import confluent_kafka as confluent
    from confluent_kafka.admin import (
        AclBinding,
        AclBindingFilter,
        AclOperation,
        AclPermissionType,
        AdminClient,
        ResourcePatternType,
        ResourceType,
    )

    conf = {"bootstrap.servers": acl_process.kafka_addr, "security.protocol": "SASL_PLAINTEXT",
            "sasl.mechanism": MECH}
    admin = AdminClient({**conf, "sasl.username": "alice", "sasl.password": PASSWORDS["alice"]})
    topic = f"rd-{uuid.uuid4().hex[:6]}"
    bindings = [AclBinding(ResourceType.TOPIC, "rd-", ResourcePatternType.PREFIXED, "User:bob",
                           "*", AclOperation.WRITE, AclPermissionType.ALLOW),
                AclBinding(ResourceType.GROUP, "cg", ResourcePatternType.LITERAL, "User:bob",
                           "*", AclOperation.READ, AclPermissionType.ALLOW)]

    def produced() -> int:
        """The delivery report's error code (0: stored)."""
        producer = confluent.Producer({**conf, "sasl.username": "bob",
                                       "sasl.password": PASSWORDS["bob"],
                                       "message.timeout.ms": TIMEOUT * 1000})
        reports: list = []
        producer.produce(topic, b"librdkafka", on_delivery=lambda err, msg: reports.append(err))
        assert producer.flush(TIMEOUT) == 0
        return 0 if reports[0] is None else reports[0].code()

    admin.create_topics([confluent.admin.NewTopic(topic, 1, 1)])[topic].result(timeout=TIMEOUT)
    assert produced() == confluent.KafkaError.TOPIC_AUTHORIZATION_FAILED
    for future in admin.create_acls(bindings, request_timeout=TIMEOUT).values():
        assert future.result(timeout=TIMEOUT) is None
    assert len(load_users(acl_process.users_file).acls) == 2
    assert produced() == 0
    every = AclBindingFilter(ResourceType.ANY, None, ResourcePatternType.ANY, None, None,
                             AclOperation.ANY, AclPermissionType.ANY)
    listed = admin.describe_acls(every, request_timeout=TIMEOUT).result(timeout=TIMEOUT)
    assert sorted(b.name for b in listed) == ["cg", "rd-"]
    deleted = admin.delete_acls([every], request_timeout=TIMEOUT)
    assert len(next(iter(deleted.values())).result(timeout=TIMEOUT)) == 2
    assert load_users(acl_process.users_file).acls == ()
