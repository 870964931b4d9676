"""Admin APIs on a cluster: a topic's configuration lives in every broker group that holds
some of its partitions, so CreateTopics, CreatePartitions, DeleteTopics and the alter APIs
received by any broker act on every such group (docs/kafka.md, "Admin APIs").

The receiving broker applies its own group's part itself (when it is the master) and forwards
each other group's part to that group's master over the Kafka listeners, as the same API with
the body reduced to that group's part.  A forwarded request carries the cluster's signature in
its client id, as transaction markers do (``markers.py``): ``txbroker-cluster:<hex
HMAC-SHA256>`` over the API key and the request body, with ``cluster_secret``; without a
secret the bare ``txbroker-cluster``.  A broker obeys a forwarded request for its own group
only and never forwards it again; one whose signature does not check is answered
CLUSTER_AUTHORIZATION_FAILED.  With ``kafka_sasl_mechanisms`` set, the connection first logs in
as the cluster's own account (``peer_auth.py``).

Order keeps the numbering still (``cluster_view.py``): a topic is created group by group from
the lowest node id up and deleted from the highest down, and new partitions go to the group
whose block is last, so no group's block of partitions moves while others' change.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import itertools
import logging
import ssl

import orjson

from txbroker.config import BrokerConfig
from txbroker.remoting.kafka.errors import ErrorCode
from txbroker.remoting.kafka.framing import (
    decode_request,
    decode_response,
    encode_request,
)
from txbroker.remoting.kafka.primitives import KafkaDecodeError
from txbroker.service.cluster_auth import CLUSTER_ACCESS_KEY
from txbroker.service.kafka.cluster_view import KafkaNode
from txbroker.service.kafka.context import KafkaRequestContext
from txbroker.service.kafka.peer_auth import authenticate

log = logging.getLogger("txbroker.kafka")

#: One forwarded request waits at most this long for its answer.
FORWARD_TIMEOUT = 10.0
#: Largest answer read from a peer.
MAX_ANSWER = 1 << 20

_corr = itertools.count(1)


def _content(api_key: int, body: dict) -> bytes:
    return orjson.dumps([api_key, body], option=orjson.OPT_SORT_KEYS)


def _signed_id(api_key: int, body: dict, secret: str | None) -> str:
    if secret is None:
        return CLUSTER_ACCESS_KEY
    mac = hmac.new(secret.encode(), _content(api_key, body), hashlib.sha256).hexdigest()
    return f"{CLUSTER_ACCESS_KEY}:{mac}"


def from_peer(ctx: KafkaRequestContext, body: dict, secret: str | None) -> bool | str:
    """False for a client's request; True for a forwarded one that may be obeyed; else why
    it may not (the answer is CLUSTER_AUTHORIZATION_FAILED)."""
    if ctx.client_id != CLUSTER_ACCESS_KEY and not ctx.client_id.startswith(f"{CLUSTER_ACCESS_KEY}:"):
        return False
    expected = _signed_id(ctx.api_key, body, secret)
    if hmac.compare_digest(ctx.client_id.encode(), expected.encode()):
        return True
    return "it is not signed with this cluster's cluster_secret"


async def forward(node: KafkaNode, api_key: int, version: int, body: dict,
                  config: BrokerConfig, tls: ssl.SSLContext | None = None) -> dict:
    """Send ``body`` to ``node`` as a forwarded request; its answer's body.  ``tls`` is how
    this node dials its peers (``ClusterView.tls_context``; None: plaintext); with Kafka SASL
    on, the connection logs in as the cluster account first (``peer_auth.authenticate``).
    Raises OSError (a refused certificate included), TimeoutError or ValueError when there is
    no whole answer (or the login was refused)."""
    secret = config.cluster_secret
    corr = next(_corr) & 0x7FFFFFFF
    # The signature covers the body as the peer decodes it (defaults filled in).
    canonical = decode_request(encode_request(api_key, version, corr, None, body)[4:]).body
    frame = encode_request(api_key, version, corr, _signed_id(api_key, canonical, secret), body)

    async def exchange() -> bytes:
        reader, writer = await asyncio.open_connection(node.host, node.port, ssl=tls)
        try:
            await authenticate(reader, writer, config)
            writer.write(frame)
            size = int.from_bytes(await reader.readexactly(4), "big", signed=True)
            if not 0 < size <= MAX_ANSWER:
                raise ValueError(f"answer of {size} bytes")
            return await reader.readexactly(size)
        finally:
            writer.close()

    try:
        answer = await asyncio.wait_for(exchange(), FORWARD_TIMEOUT)
        got, out = decode_response(api_key, version, answer)
    except (asyncio.IncompleteReadError, KafkaDecodeError) as exc:
        raise ValueError(f"no whole answer from {node.host}:{node.port}: {exc}") from exc
    if got != corr:
        raise ValueError(f"answer from {node.host}:{node.port} to another request")
    return out


def spread(count: int, groups: int) -> list[int]:
    """``count`` partitions over ``groups`` groups in node-id order, the first ones one more."""
    return [count // groups + (1 if i < count % groups else 0) for i in range(groups)]


#: A part of the cluster that could not be asked (or a view not complete yet): retriable.
UNREACHABLE = ErrorCode.REQUEST_TIMED_OUT
