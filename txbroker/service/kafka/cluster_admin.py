"""Admin APIs on a cluster: a topic's configuration lives in every broker group that holds
some of its partitions, so CreateTopics, CreatePartitions, DeleteTopics and the alter APIs
received by any broker act on every such group (docs/kafka.md, "Admin APIs").

The receiving broker applies its own group's part itself (when it is the master) and forwards
each other group's part to that group's master over the Kafka listeners, as the same API with
the body reduced to that group's part.  A forwarded request carries the cluster envelope in
its client id, as transaction markers do (``peer_envelope.py``: a timestamp, a nonce and an
HMAC over the API key, version, the group it is meant for and the body, with
``cluster_secret``); without a secret the bare ``txbroker-cluster``.  A broker obeys a
forwarded request for its own group only and never forwards it again; one whose envelope does
not check (a wrong signature, another group's, a stale or repeated one) is answered
CLUSTER_AUTHORIZATION_FAILED.  With ``kafka_sasl_mechanisms`` set, the connection first logs
in as the cluster's own account (``peer_auth.py``).

Order keeps the numbering still (``cluster_view.py``): a topic is created group by group from
the lowest node id up and deleted from the highest down, and new partitions go to the group
whose block is last, so no group's block of partitions moves while others' change.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import ssl

from txbroker.config import BrokerConfig
from txbroker.remoting.kafka.errors import ErrorCode
from txbroker.remoting.kafka.framing import decode_response, encode_request
from txbroker.remoting.kafka.primitives import KafkaDecodeError
from txbroker.service.kafka.cluster_view import KafkaNode
from txbroker.service.kafka.peer_auth import authenticate
from txbroker.service.kafka.peer_envelope import client_id

log = logging.getLogger("txbroker.kafka")

#: One forwarded request waits at most this long for its answer.
FORWARD_TIMEOUT = 10.0
#: Largest answer read from a peer.
MAX_ANSWER = 1 << 20

_corr = itertools.count(1)


async def forward(group: str, node: KafkaNode, api_key: int, version: int, body: dict,
                  config: BrokerConfig, tls: ssl.SSLContext | None = None) -> dict:
    """Send ``body`` to ``node``, broker group ``group``'s master, as a forwarded request
    (signed for that group only); its answer's body.  ``tls`` is how
    this node dials its peers (``ClusterView.tls_context``; None: plaintext); with Kafka SASL
    on, the connection logs in as the cluster account first (``peer_auth.authenticate``).
    Raises OSError (a refused certificate included), TimeoutError or ValueError when there is
    no whole answer (or the login was refused)."""
    corr = next(_corr) & 0x7FFFFFFF
    frame = encode_request(api_key, version, corr,
                           client_id(api_key, version, body, config.cluster_secret, to=group),
                           body)

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
