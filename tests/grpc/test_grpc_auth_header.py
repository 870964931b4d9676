"""The gRPC port's signature check without a socket: the ``authorization`` header read (what
5.x clients send, what they never send, arbitrary text), the signature verified, and the
resources each request type needs."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.grpc.raw import signed_metadata
from txbroker.remoting.grpc import definition_pb2 as pb
from txbroker.remoting.grpc import service_pb2 as spb
from txbroker.service.acl import AclDenied
from txbroker.service.acl_rules import Account, Perm
from txbroker.service.grpc.auth import (
    MAX_AUTHORIZATION_LENGTH,
    parse_authorization,
    required_resources,
    sign,
    signed_by,
)

ACCOUNT = Account(access_key="order-service", secret_key="order-secret")
#: A call of the Node.js client 1.0.8 (upper-case hex) at 2026-12-07 23:01:02 UTC.
NODE_DATE = "20261207T230102Z"


def headers(access_key: str = "order-service", secret: str = "order-secret", **kw) -> dict:
    return dict(signed_metadata(access_key, secret, date_time=NODE_DATE, **kw))


@pytest.mark.parametrize("upper", [False, True])
def test_a_clients_signature_verifies_in_either_case(upper) -> None:
    call = parse_authorization(headers(upper=upper))
    assert call is not None and call.access_key == "order-service"
    assert call.date_time == NODE_DATE
    assert signed_by(call, ACCOUNT)
    assert sign("order-secret", NODE_DATE) == call.signature.hex()


def test_another_secret_or_date_does_not_verify() -> None:
    assert not signed_by(parse_authorization(headers(secret="other-secret")), ACCOUNT)
    meta = headers()
    meta["x-mq-date-time"] = "20261207T230103Z"  # the header of one call with another date
    assert not signed_by(parse_authorization(meta), ACCOUNT)


def test_no_header_is_none_and_an_empty_credential_names_no_key() -> None:
    assert parse_authorization({"x-mq-client-id": "c"}) is None
    meta = headers()
    meta["authorization"] = meta["authorization"].replace("Credential=order-service",
                                                          "Credential=")
    assert parse_authorization(meta).access_key == ""


def test_a_credential_scope_after_a_slash_is_not_the_key() -> None:
    meta = headers()
    meta["authorization"] = meta["authorization"].replace(
        "Credential=order-service", "Credential=order-service/20261207/region")
    assert parse_authorization(meta).access_key == "order-service"


@pytest.mark.parametrize("mutate, reason", [
    (lambda a, d: ("MQv2-HMAC-SHA256" + a[len("MQv2-HMAC-SHA1"):], d), "scheme"),
    (lambda a, d: (a.replace("Signature=", "Signature=g"), d), "not hexadecimal"),
    (lambda a, d: (a.replace("Signature=", "Signature=a"), d), "not hexadecimal"),
    (lambda a, d: (a.replace("Signature=", "Signature=a "), d), "not hexadecimal"),
    (lambda a, d: (a[:-2], d), "bytes"),
    (lambda a, d: (a.split(", Signature")[0], d), "Credential and Signature"),
    (lambda a, d: (a + ", Signature=00", d), "twice"),
    (lambda a, d: (a + ", junk", d), "name=value"),
    (lambda a, d: (a.replace("x-mq-date-time", "host"), d), "SignedHeaders"),
    (lambda a, d: (a, None), "missing"),
    (lambda a, d: (a, "2026-12-07T23:01:02Z"), "yyyyMMdd"),
    (lambda a, d: (a, "2026127T23012Z"), "yyyyMMdd"),
    (lambda a, d: (a + " " * MAX_AUTHORIZATION_LENGTH, d), "longer"),
])
def test_a_garbled_header_is_a_credentials_failure(mutate, reason) -> None:
    meta = headers()
    meta["authorization"], date = mutate(meta["authorization"], meta["x-mq-date-time"])
    if date is None:
        del meta["x-mq-date-time"]
    else:
        meta["x-mq-date-time"] = date
    with pytest.raises(AclDenied) as err:
        parse_authorization(meta)
    assert err.value.credentials and reason in err.value.message


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=300), st.one_of(st.none(), st.text(max_size=40)))
def test_any_header_is_read_or_refused(authorization, date_time) -> None:
    meta = {"authorization": authorization}
    if date_time is not None:
        meta["x-mq-date-time"] = date_time
    try:
        call = parse_authorization(meta)
    except AclDenied as exc:
        assert exc.credentials
    else:
        assert call is not None and len(call.signature) == 20


def _queue(topic: str) -> pb.MessageQueue:
    return pb.MessageQueue(topic=pb.Resource(name=topic))


def test_each_request_needs_what_the_broker_port_asks_for_the_same_action() -> None:
    topic, group = pb.Resource(name="Orders"), pb.Resource(name="appliers")
    sub = {"Orders": Perm.SUB, "%RETRY%appliers": Perm.SUB}
    assert required_resources("SendMessage", spb.SendMessageRequest(messages=[
        pb.Message(topic=topic), pb.Message(topic=pb.Resource(name="Audit"))])) == \
        {"Orders": Perm.PUB, "Audit": Perm.PUB}
    for request in (spb.EndTransactionRequest(topic=topic), spb.RecallMessageRequest(topic=topic)):
        assert required_resources("x", request) == {"Orders": Perm.PUB}
    assert required_resources("QueryRoute", spb.QueryRouteRequest(topic=topic)) == \
        {"Orders": Perm.ANY}
    assert required_resources("ReceiveMessage", spb.ReceiveMessageRequest(
        group=group, message_queue=_queue("Orders"))) == sub
    for kind in (spb.AckMessageRequest, spb.ChangeInvisibleDurationRequest,
                 spb.ForwardMessageToDeadLetterQueueRequest, spb.QueryAssignmentRequest):
        assert required_resources("x", kind(group=group, topic=topic)) == sub, kind
    assert required_resources("Heartbeat", spb.HeartbeatRequest(
        client_type=pb.PRODUCER, group=group)) == {}
    assert required_resources("Heartbeat", spb.HeartbeatRequest(
        client_type=pb.SIMPLE_CONSUMER, group=group)) == {"%RETRY%appliers": Perm.SUB}
    assert required_resources("Telemetry", pb.Settings(
        publishing=pb.Publishing(topics=[topic]))) == {"Orders": Perm.PUB}
    assert required_resources("Telemetry", pb.Settings(subscription=pb.Subscription(
        group=group, subscriptions=[pb.SubscriptionEntry(topic=topic)]))) == sub
    assert required_resources("Telemetry", spb.TelemetryCommand()) == {}
