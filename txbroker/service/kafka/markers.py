"""Transaction markers between broker groups: Kafka's WriteTxnMarkers (API 27, v1) over the
Kafka listeners (docs/kafka.md, "Kafka on a cluster").

The coordinator of a transaction whose partitions or consumer-group coordinator live in other
broker groups ("participants") writes its decision first (PrepareCommit / PrepareAbort), then
calls :meth:`MarkerSender.send`: one WriteTxnMarkers request to each participant group's master
— producer id, epoch, result, the group's partitions, and the transaction number in the
``coordinator_epoch`` field, which is what makes a marker idempotent at the participant
(:mod:`staging`).  Only when every participant answered NONE is the transaction complete; a
participant that is down or fails over is asked again by the coordinator's scan (and by its
recovery) until it answers.  A participant that is this broker itself is called directly.

Kafka authorises WriteTxnMarkers with the CLUSTER_ACTION ACL; here, with ``cluster_secret``
set, a marker must carry the cluster envelope in its client id (``peer_envelope.py``: a
timestamp, a nonce and an HMAC over the whole request body), so no Kafka client can commit or
abort another producer's transaction, and a marker captured on the path cannot be sent again.
Anything else is answered CLUSTER_AUTHORIZATION_FAILED and logged once per peer.  With
``kafka_sasl_mechanisms`` set, a new connection to a participant first logs in as the
cluster's own account (``peer_auth.py``).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import Callable

from txbroker.config import BrokerConfig
from txbroker.remoting.kafka.apis import ApiKey
from txbroker.remoting.kafka.errors import ErrorCode
from txbroker.remoting.kafka.framing import decode_response, encode_request
from txbroker.remoting.kafka.primitives import KafkaDecodeError
from txbroker.remoting.tls import link_failure
from txbroker.service.cluster_auth import OncePerPeer, reason_of
from txbroker.service.kafka.cluster_view import ClusterView
from txbroker.service.kafka.context import Handler, KafkaRequestContext
from txbroker.service.kafka.peer_auth import authenticate
from txbroker.service.kafka.peer_envelope import client_id
from txbroker.service.kafka.staging import TxnStaging

log = logging.getLogger("txbroker.kafka")

#: The version sent and served (Kafka 4 serves 1-2; 2 adds the transaction-protocol version).
VERSION = 1
#: One marker round trip waits at most this long before the coordinator retries later.
MARKER_TIMEOUT = 5.0
#: Largest answer read from a participant.
MAX_ANSWER = 1 << 20
#: Idle connections kept per participant (one per marker in flight at once, up to this).
MAX_IDLE = 8
#: The partition named in a marker to a group that holds only staged consumer offsets (Kafka
#: sends those markers to a partition of this topic).
OFFSETS_TOPIC = "__consumer_offsets"

#: participant broker group -> [(topic, partition)] (empty: consumer offsets only)
Participants = dict[str, list[tuple[str, int]]]


def refused_why(ctx: KafkaRequestContext, secret: str | None) -> str | None:
    """None when a marker request may be obeyed (the envelope's verdict, ``ctx.cluster_peer``),
    else why not.  Without a secret there is nothing to check."""
    if secret is None or ctx.cluster_peer is True:
        return None
    if isinstance(ctx.cluster_peer, str):
        return ctx.cluster_peer
    return "it is not signed with this cluster's cluster_secret"


class MarkerSender:
    """The coordinator's side: deliver a decision to every participant group."""

    def __init__(self, config: BrokerConfig, view: ClusterView, staging: TxnStaging) -> None:
        self.config = config
        self.view = view
        self.staging = staging
        self._corr = itertools.count(1)
        #: (host, port) -> idle connections to that participant's Kafka listener.
        self._idle: dict[tuple[str, int], list[tuple[asyncio.StreamReader, asyncio.StreamWriter]]] = {}
        self._closed = False
        #: A participant refusing our login is logged once per reason (markers are retried).
        self._refusals = OncePerPeer()

    async def send(self, pid: int, epoch: int, txn: int, commit: bool,
                   participants: Participants) -> bool:
        """True once every participant applied (or already had applied) the marker."""
        results = await asyncio.gather(*(self._one(group, pid, epoch, txn, commit, parts)
                                         for group, parts in participants.items()))
        return all(results)

    async def _one(self, group: str, pid: int, epoch: int, txn: int, commit: bool,
                   parts: list[tuple[str, int]]) -> bool:
        if group == self.config.broker_name:
            err = await self.staging.apply(pid, epoch, txn, commit) if self.staging.ready \
                else ErrorCode.NOT_LEADER_OR_FOLLOWER
            return self._answered(group, err)
        leader = self.view.leader_of(group)
        if leader is None:
            log.info("transaction marker (producer %d, txn %d) for group %s: no master now; "
                     "retried", pid, txn, group)
            return False
        topics: dict[str, list[int]] = {}
        for topic, partition in parts or [(OFFSETS_TOPIC, 0)]:
            topics.setdefault(topic, []).append(partition)
        markers = [{"producer_id": pid, "producer_epoch": epoch, "transaction_result": commit,
                    "coordinator_epoch": txn,
                    "topics": [{"name": t, "partition_indexes": ps} for t, ps in topics.items()]}]
        corr = next(self._corr) & 0x7FFFFFFF
        body = {"markers": markers}
        frame = encode_request(ApiKey.WRITE_TXN_MARKERS, VERSION, corr,
                               client_id(ApiKey.WRITE_TXN_MARKERS, VERSION, body,
                                         self.config.cluster_secret, to=group), body)
        addr = f"{leader.host}:{leader.port}"
        try:
            answer = await asyncio.wait_for(self._call(leader.host, leader.port, frame),
                                            MARKER_TIMEOUT)
            got_corr, body = decode_response(ApiKey.WRITE_TXN_MARKERS, VERSION, answer)
        except (OSError, TimeoutError, asyncio.IncompleteReadError, KafkaDecodeError,
                ValueError) as exc:
            log.info("transaction marker (producer %d, txn %d) to group %s at %s: %s; retried",
                     pid, txn, group, addr, link_failure(exc))
            return False
        errors = {p["error_code"] for m in body.get("markers") or ()
                  for t in m.get("topics") or () for p in t.get("partitions") or ()}
        if got_corr != corr or not errors:
            log.info("transaction marker to group %s at %s: a malformed answer; retried", group, addr)
            return False
        return self._answered(group, max(errors, key=lambda e: e != 0))

    @staticmethod
    def _answered(group: str, err: int) -> bool:
        if err != ErrorCode.NONE:
            log.info("transaction marker refused by group %s: %s; retried", group,
                     ErrorCode(err).name if err in ErrorCode._value2member_map_ else err)
        return err == ErrorCode.NONE

    async def _call(self, host: str, port: int, frame: bytes) -> bytes:
        """One request and its answer on an idle connection to ``host:port`` (a new one when
        none is idle).  A connection carries one request at a time and goes back to the idle
        list only after its answer was read whole, so it never holds an answer meant for an
        abandoned attempt; any failure closes it."""
        idle = self._idle.setdefault((host, port), [])
        # A kept connection may have been closed by the participant meanwhile (a restart):
        # then the next one, then a new one (a marker is idempotent: sending it again is safe).
        while idle:
            reader, writer = idle.pop()
            try:
                return await self._exchange(idle, reader, writer, frame)
            except (OSError, asyncio.IncompleteReadError):
                continue
        reader, writer = await asyncio.open_connection(host, port, ssl=self.view.tls_context)
        await authenticate(reader, writer, self.config, self._refusals)
        return await self._exchange(idle, reader, writer, frame)

    async def _exchange(self, idle: list, reader: asyncio.StreamReader,
                        writer: asyncio.StreamWriter, frame: bytes) -> bytes:
        ok = False
        try:
            writer.write(frame)
            size = int.from_bytes(await reader.readexactly(4), "big", signed=True)
            if not 0 < size <= MAX_ANSWER:
                raise ValueError(f"answer of {size} bytes")
            answer = await reader.readexactly(size)
            ok = True
            return answer
        finally:
            if ok and len(idle) < MAX_IDLE and not self._closed:
                idle.append((reader, writer))
            else:
                writer.close()

    def close(self) -> None:
        """Close the idle connections (the broker is stopping)."""
        self._closed = True
        for conns in self._idle.values():
            for _, writer in conns:
                writer.close()
        self._idle.clear()


def marker_handler(config: BrokerConfig, staging: TxnStaging | None,
                   leads: Callable[[], bool]) -> Handler:
    """The participant's side: WriteTxnMarkers applied to what this group staged."""
    once = OncePerPeer()

    async def handle(ctx: KafkaRequestContext, body: dict) -> dict:
        markers = body.get("markers") or []
        why = refused_why(ctx, config.cluster_secret)
        if staging is None:
            why = "this broker is not part of a cluster"
        if why is not None:
            once(ctx.peer.rpartition(":")[0],
                 f"WriteTxnMarkers from {ctx.peer} refused: {why}", reason_of(why))
        out = []
        for m in markers:
            if why is not None:
                err = ErrorCode.CLUSTER_AUTHORIZATION_FAILED
            elif not leads() or staging is None or not staging.ready:
                err = ErrorCode.NOT_LEADER_OR_FOLLOWER
            else:
                err = await staging.apply(m["producer_id"], m["producer_epoch"],
                                          m["coordinator_epoch"], bool(m["transaction_result"]))
            out.append({"producer_id": m["producer_id"], "topics": [
                {"name": t["name"], "partitions": [{"partition_index": p, "error_code": err}
                                                   for p in t["partition_indexes"]]}
                for t in m["topics"]]})
        return {"markers": out}

    return handle
