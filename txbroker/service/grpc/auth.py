"""Signed calls on the gRPC port: RocketMQ 5.x clients' ``authorization`` header checked
against the broker's access keys, with the broker port's rules (docs/security.md, "RocketMQ
5.x clients").

A 5.x client with credentials adds two headers to every call, streams included (Java
``Signature``, Python ``util/signature.py``, Node.js ``BaseClient.getRequestMetadata``)::

    x-mq-date-time: 20261207T230102Z
    authorization:  MQv2-HMAC-SHA1 Credential=<accessKey>, SignedHeaders=x-mq-date-time,
                    Signature=<hex HMAC-SHA1(secretKey, the x-mq-date-time value)>

Python writes the hex in lower case, Node.js in upper case; RocketMQ's proxy decodes it
(``DefaultAuthenticationContextBuilder.hexToBase64``) and so does :func:`parse_authorization`.
RocketMQ does not compare the date with its clock, and neither does txbroker: the Python client
5.1.2 writes its *local* time with a ``Z`` suffix, so a clock check would refuse every Python
client east or west of UTC.  The date must still be one (``yyyyMMdd'T'HHmmss'Z'``).

Who may do what is decided once for both RocketMQ ports: :meth:`AclGuard.check
<txbroker.service.acl.AclGuard.check>` runs :func:`~txbroker.service.acl.decide` (white-listed
addresses, unknown key, signature, per-topic and per-group permissions, the user store's roles)
with this port's signature check and the resources :func:`required_resources` reads from the
request, and :meth:`AclGuard.settle <txbroker.service.acl.AclGuard.settle>` counts failures in
the same per-address back-off.  Every RPC passes before its handler runs, so a refused call
stores and changes nothing.  Refusals answer, in the response's status:

* UNAUTHORIZED (40100): no or an empty access key, a header that cannot be read, an access key
  the broker does not know, a wrong signature;
* FORBIDDEN (40300): a known, rightly signed key without the permission the call needs.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import string
import time
from collections.abc import Mapping
from dataclasses import dataclass

from google.protobuf.message import Message as ProtoMessage

from txbroker.remoting.grpc import definition_pb2 as pb
from txbroker.remoting.grpc import service_pb2 as spb
from txbroker.service.acl import AclDenied, AclGuard
from txbroker.service.acl_rules import Account, Perm, retry_topic
from txbroker.service.grpc.status import Code, GrpcError

AUTHORIZATION = "authorization"
DATE_TIME = "x-mq-date-time"
ALGORITHM = "MQv2-HMAC-SHA1"
SIGNED_HEADERS = DATE_TIME
#: The date format of ``x-mq-date-time`` (Java ``yyyyMMdd'T'HHmmss'Z'``).
DATE_FORMAT = "%Y%m%dT%H%M%SZ"
DATE_LENGTH = len("20261207T230102Z")
#: Longest ``authorization`` header read (a real one is about 130 characters); longer is
#: refused unread.
MAX_AUTHORIZATION_LENGTH = 1024
#: HMAC-SHA1 digests are 20 bytes.
SIGNATURE_BYTES = 20


@dataclass(frozen=True)
class SignedCall:
    """What a call's headers claim: an access key ("" = none) and the signature of ``date_time``."""

    access_key: str
    signature: bytes
    date_time: str


def malformed(reason: str) -> AclDenied:
    return AclDenied(f"the {AUTHORIZATION} header is malformed: {reason}", credentials=True)


def parse_authorization(metadata: Mapping[str, str]) -> SignedCall | None:
    """The signed claim of a call's headers; None without an ``authorization`` header.
    Raises :class:`AclDenied` (a credentials failure) for one that cannot be read.  Pure."""
    header = metadata.get(AUTHORIZATION)
    if header is None:
        return None
    if len(header) > MAX_AUTHORIZATION_LENGTH:
        raise malformed(f"longer than {MAX_AUTHORIZATION_LENGTH} characters")
    algorithm, _, rest = header.strip().partition(" ")
    if algorithm != ALGORITHM:
        raise malformed(f"the scheme is {algorithm[:40]!r}, not {ALGORITHM}")
    fields: dict[str, str] = {}
    for item in rest.split(","):
        name, sep, value = item.strip().partition("=")
        if not sep:
            raise malformed(f"{item.strip()[:40]!r} is not name=value")
        if name in fields:
            raise malformed(f"{name[:40]} is given twice")
        fields[name] = value.strip()
    if "Signature" not in fields or "Credential" not in fields:
        raise malformed("it needs Credential and Signature")
    signed_headers = fields.get("SignedHeaders", SIGNED_HEADERS)
    if signed_headers.lower() != SIGNED_HEADERS:
        raise malformed(f"SignedHeaders is {signed_headers[:40]!r}; only {SIGNED_HEADERS} is "
                        "verified")
    access_key = fields["Credential"].split("/", 1)[0]
    hex_signature = fields["Signature"]
    if hex_signature.strip(string.hexdigits):
        raise malformed("Signature is not hexadecimal")
    try:
        signature = bytes.fromhex(hex_signature)
    except ValueError:  # an odd number of digits
        raise malformed("Signature is not hexadecimal") from None
    if len(signature) != SIGNATURE_BYTES:
        raise malformed(f"Signature is {len(signature)} bytes, not the {SIGNATURE_BYTES} of "
                        "an HMAC-SHA1")
    date_time = metadata.get(DATE_TIME, "")
    if not date_time:
        raise malformed(f"the {DATE_TIME} header it signs is missing")
    try:  # strptime also takes one-digit fields: the length holds it to the 16 characters
        if len(date_time) != DATE_LENGTH:
            raise ValueError(date_time)
        time.strptime(date_time, DATE_FORMAT)
    except ValueError:
        raise malformed(f"{DATE_TIME} {date_time[:40]!r} is not yyyyMMdd'T'HHmmss'Z'") from None
    return SignedCall(access_key, signature, date_time)


def sign(secret_key: str, date_time: str) -> str:
    """The signature a client sends: hex HMAC-SHA1 of ``date_time`` keyed by ``secret_key``."""
    return hmac.new(secret_key.encode(), date_time.encode(), hashlib.sha1).hexdigest()


def signed_by(call: SignedCall, account: Account) -> bool:
    return hmac.compare_digest(bytes.fromhex(sign(account.secret_key, call.date_time)),
                               call.signature)


# --- what each RPC touches -----------------------------------------------------------------------


def _add(out: dict[str, Perm], name: str, perm: Perm) -> None:
    if name:
        out[name] = perm


def _subscribe(out: dict[str, Perm], group: str, topic: str = "") -> None:
    """A consumer's call: SUB on the topic and on the group (the resource ``%RETRY%<group>``,
    as the broker port names a group)."""
    _add(out, topic, Perm.SUB)
    if group:
        out[retry_topic(group)] = Perm.SUB


def required_resources(rpc: str, request: ProtoMessage) -> dict[str, Perm]:
    """Resource -> permission a 5.x call needs, as the broker port asks of the remoting request
    doing the same (``service/acl.required_resources``): sending and ending a transaction need
    PUB on the topic, consuming SUB on the topic and the group, a route PUB or SUB (the route
    also creates a missing topic where auto-creation is on)."""
    out: dict[str, Perm] = {}
    if isinstance(request, spb.SendMessageRequest):
        for m in request.messages:
            _add(out, m.topic.name, Perm.PUB)
    elif isinstance(request, (spb.EndTransactionRequest, spb.RecallMessageRequest)):
        _add(out, request.topic.name, Perm.PUB)
    elif isinstance(request, spb.QueryRouteRequest):
        _add(out, request.topic.name, Perm.ANY)
    elif isinstance(request, spb.ReceiveMessageRequest):
        _subscribe(out, request.group.name, request.message_queue.topic.name)
    elif isinstance(request, (spb.AckMessageRequest, spb.ChangeInvisibleDurationRequest,
                              spb.ForwardMessageToDeadLetterQueueRequest,
                              spb.QueryAssignmentRequest)):
        _subscribe(out, request.group.name, request.topic.name)
    elif isinstance(request, spb.HeartbeatRequest):
        if request.client_type not in (pb.PRODUCER, pb.CLIENT_TYPE_UNSPECIFIED):
            _subscribe(out, request.group.name)
    elif isinstance(request, spb.NotifyClientTerminationRequest):
        _subscribe(out, request.group.name)
    elif isinstance(request, pb.Settings):  # a Telemetry stream's settings
        if request.HasField("publishing"):
            for topic in request.publishing.topics:
                _add(out, topic.name, Perm.PUB)
        if request.HasField("subscription"):
            _subscribe(out, request.subscription.group.name)
            for entry in request.subscription.subscriptions:
                _add(out, entry.topic.name, Perm.SUB)
    return out


# --- the check ---------------------------------------------------------------------------------


def refusal(denied: AclDenied) -> GrpcError:
    """The 5.x answer to a refusal (module docstring)."""
    code = Code.UNAUTHORIZED if denied.credentials or denied.anonymous else Code.FORBIDDEN
    return GrpcError(code, denied.message)


class GrpcAuth:
    """The servicer's gate: :meth:`admit` before every call's handler."""

    def __init__(self, guard: AclGuard) -> None:
        self.guard = guard

    def decide(self, rpc: str, request: ProtoMessage, metadata: Mapping[str, str],
               peer: str, host: str) -> tuple[AclDenied | None, float]:
        """The refusal (or None) and how long to wait before answering it."""
        what = f"gRPC {rpc}"
        try:
            call = parse_authorization(metadata)
        except AclDenied as denied:
            return denied, self.guard.settle(denied, peer=peer, host=host, access_key=None,
                                             what=what)
        access_key = call.access_key if call is not None and call.access_key else None
        denied = self.guard.check(host, access_key,
                                  lambda account: call is not None and signed_by(call, account),
                                  what=what, needed=lambda: required_resources(rpc, request))
        return denied, self.guard.settle(denied, peer=peer, host=host, access_key=access_key,
                                         what=what)

    async def admit(self, rpc: str, request: ProtoMessage, metadata: Mapping[str, str],
                    peer: str, host: str) -> None:
        """Return when the call may run; else raise its :class:`GrpcError`, after the
        address's back-off when its credentials failed."""
        denied, delay = self.decide(rpc, request, metadata, peer, host)
        if denied is None:
            return
        if delay > 0:
            await asyncio.sleep(delay)
        raise refusal(denied)
