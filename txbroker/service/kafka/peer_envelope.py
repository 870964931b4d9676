"""Kafka requests one broker sends another (forwarded admin requests, transaction markers) in
the cluster envelope (:mod:`txbroker.remoting.envelope`; docs/security.md "Kafka ACLs").

Kafka's request header has one free-form field a peer may fill, the client id, so the
envelope travels there: ``txbroker-cluster:<timestamp ms>:<nonce hex>:<HMAC hex>``.  The HMAC
covers the API key and version and the broker group it is meant for as named fields, the
timestamp and the nonce, and the request body as the receiver decodes it, serialised with
sorted keys (so every value sits under its name).  The receiver refuses a stale timestamp and
a nonce it has already accepted, as the controller and the name servers do: a marker or a
forwarded CreateTopics captured on the path cannot be sent again, nor sent to another group
(whose part of a topic it would change).  With Kafka SASL on, brokers log in as the cluster's
own account, and a request claiming to be a broker's over any other login is refused: a user
holding a captured request gains nothing by sending it.

Before, each kind had its own HMAC in the client id (``cluster_admin._signed_id`` over the API
key and body, ``markers.marker_client_id`` over a projection of the markers), with no time and
no nonce.

What Kafka gives no room for is a signed *answer*: a response header is a correlation id (and,
in flexible versions, tagged fields no client of ours reads), so an answer between brokers is
trusted as it arrives.  On a network where that matters, the Kafka port runs TLS between
brokers (``tls_peers``).

:func:`verify_peers` checks the envelope once per request, in front of the APIs that act on
it (:data:`CLUSTER_APIS`), and leaves the verdict in ``ctx.cluster_peer`` for the handlers to
read: a request verified once is not a nonce seen twice.  The verdict exempts nothing from the
ACLs: a broker's login is the cluster account, a super user (``authorize.py``).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable

import orjson

from txbroker.remoting import envelope
from txbroker.remoting.envelope import (
    NONCE,
    SIGNATURE,
    TIMESTAMP,
    EnvelopeError,
    ReplayGuard,
)
from txbroker.remoting.kafka.apis import ApiKey
from txbroker.remoting.kafka.framing import decode_request, encode_request
from txbroker.service.cluster_auth import CLUSTER_ACCESS_KEY
from txbroker.service.kafka.context import Handler, KafkaRequestContext
from txbroker.service.kafka.peer_auth import CLUSTER_PRINCIPAL

log = logging.getLogger("txbroker.kafka")

#: APIs one broker sends another on a client's behalf (``admin.py``, ``metadata.py``).
FORWARDED = frozenset({ApiKey.CREATE_TOPICS, ApiKey.DELETE_TOPICS, ApiKey.CREATE_PARTITIONS,
                       ApiKey.DESCRIBE_CONFIGS, ApiKey.ALTER_CONFIGS,
                       ApiKey.INCREMENTAL_ALTER_CONFIGS})
#: The APIs a broker sends another: the forwarded admin APIs and WriteTxnMarkers.
CLUSTER_APIS = FORWARDED | {ApiKey.WRITE_TXN_MARKERS}
_PREFIX = f"{CLUSTER_ACCESS_KEY}:"


def _fields(api_key: int, api_version: int, to: str) -> dict[str, str]:
    return {"apiKey": str(int(api_key)), "apiVersion": str(int(api_version)), "to": to}


def _body_bytes(body: dict) -> bytes:
    return orjson.dumps(body, option=orjson.OPT_SORT_KEYS)


def canonical(api_key: int, api_version: int, body: dict) -> dict:
    """``body`` as the receiving broker will decode it (defaults filled in), which is what
    the envelope must cover."""
    return decode_request(encode_request(api_key, api_version, 0, None, body)[4:]).body


def signed_client_id(api_key: int, api_version: int, body: dict, secret: str | None, *,
                     to: str, now: float, nonce: bytes) -> str:
    """The client id of a request to broker group ``to`` (``body`` as :func:`canonical`
    gives it).  Without a secret, the bare cluster name (which earns no trust: see
    :func:`verdict`)."""
    if secret is None:
        return CLUSTER_ACCESS_KEY
    ext = _fields(api_key, api_version, to)
    envelope.sign_request(secret, api_key, ext, _body_bytes(body), now=now, nonce=nonce)
    return f"{_PREFIX}{ext[TIMESTAMP]}:{ext[NONCE]}:{ext[SIGNATURE]}"


def client_id(api_key: int, api_version: int, body: dict, secret: str | None, *,
              to: str) -> str:
    """:func:`signed_client_id` with this node's clock and a fresh nonce."""
    return signed_client_id(api_key, api_version, canonical(api_key, api_version, body), secret,
                            to=to, now=time.time(), nonce=os.urandom(envelope.NONCE_BYTES))


def verdict(ctx: KafkaRequestContext, body: dict, secret: str | None, here: str,
            replays: ReplayGuard, now: float) -> bool | str:
    """False: a client's request; True: a request of another broker of this cluster to this
    broker group (``here``); a string: one that claims to be and is not, and why (pure but
    for ``replays``)."""
    cid = ctx.client_id
    if cid != CLUSTER_ACCESS_KEY and not cid.startswith(_PREFIX):
        return False
    if ctx.principal is not None and ctx.principal != CLUSTER_PRINCIPAL:
        # With Kafka SASL on, brokers log in as the cluster's own account (peer_auth.py): a
        # broker's request over anyone else's login was taken off the wire by that user.
        return f"it comes over a connection logged in as {ctx.principal}, not as a broker"
    if secret is None:
        # Nothing to check: the bare name marks a forwarded request (acted on here only, never
        # forwarded again) and earns no exemption from the ACLs (authorize.py).
        return True if cid == CLUSTER_ACCESS_KEY else \
            "it is signed with a cluster_secret, but none is set here"
    parts = cid[len(_PREFIX):].split(":")
    if len(parts) != 3:
        return "it is not signed with this cluster's cluster_secret"
    ext = _fields(ctx.api_key, ctx.api_version, here)
    ext[TIMESTAMP], ext[NONCE], ext[SIGNATURE] = parts
    try:
        stamp = envelope.verify_request(secret, ctx.api_key, ext, _body_bytes(body))
        replays.admit(stamp, now)
    except EnvelopeError as exc:
        if exc.reason.startswith("its signature does not match"):
            return "it is not signed with this cluster's cluster_secret"
        return str(exc)
    except (TypeError, orjson.JSONEncodeError) as exc:  # a body the canonical form cannot hold
        return f"its body cannot be checked ({exc})"
    return True


def verify_peers(handlers: dict[int, Handler], secret: str | None, here: str, *,
                 clock: Callable[[], float] = time.time) -> dict[int, Handler]:
    """``handlers`` with the envelope checked (once, here) in front of :data:`CLUSTER_APIS`
    for broker group ``here``; the verdict goes to ``ctx.cluster_peer``.  Outermost: every
    other wrapper reads it."""
    replays = ReplayGuard()

    def gate(handler: Handler) -> Handler:
        async def checked(ctx: KafkaRequestContext, body: dict) -> dict | None:
            ctx.cluster_peer = verdict(ctx, body, secret, here, replays, clock())
            return await handler(ctx, body)
        return checked

    return {k: gate(h) if k in CLUSTER_APIS else h for k, h in handlers.items()}
