"""What a Kafka request handler is given and what it returns.

Handlers are ``async def handler(ctx, body) -> dict | None``: ``body`` is the decoded request
(field names are the Kafka message-spec names in snake_case, ``TopicData`` -> ``topic_data``;
arrays are lists of dicts, or of values for arrays of a primitive), the answer is the response
body in the same form (fields left out take the spec's default) or None for no response at all
(Produce with ``acks=0``).  The listener encodes the answer at ``ctx.api_version``."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass


@dataclass(slots=True)
class KafkaRequestContext:
    api_key: int
    api_version: int
    correlation_id: int
    #: The request header's client id ("" when null).
    client_id: str
    #: ``host:port`` of the client.
    peer: str
    #: The listener's id of the connection (stable while it is open).
    conn_id: int
    #: ``User:<name>`` of an authenticated (SASL) connection; None without authentication,
    #: where no Kafka ACL applies (docs/security.md, "Kafka ACLs").
    principal: str | None = None
    #: Whether another broker of this cluster sent it (``peer_envelope.verify_peers``, in
    #: front of the APIs brokers send each other): False, a client's request; True, a peer's
    #: whose envelope checked; a string, one claiming to be a peer's that is not, and why.
    cluster_peer: bool | str = False


Handler = Callable[[KafkaRequestContext, dict], Awaitable[dict | None]]
