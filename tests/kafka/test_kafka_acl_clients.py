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
