"""5.x clients as the broker knows them: their settings and their Telemetry streams.

A 5.x client opens one Telemetry stream per endpoint and sends its ``Settings`` on it first
(what it is, the topics it publishes or the group and subscriptions it consumes); the broker
answers with the settings it should run with (docs/grpc.md, "Settings").  The stream then
stays open as the broker's only way to reach the client: check-backs of orphaned transactions
go down it as ``RecoverOrphanedTransactionCommand``.

A producer's stream is a :class:`TelemetryChannel`, which the transaction service's check-back
treats like a remoting connection of the producer group named after each topic the client
publishes (the proxy's rule: a 5.x producer has no group, ``ClientActivity.registerProducer``),
so the check service sends, rotates and gives back checks to gRPC producers exactly as to
4.x ones.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

from txbroker.remoting.command import RemotingCommand
from txbroker.remoting.grpc import definition_pb2 as pb
from txbroker.remoting.grpc import service_pb2 as spb
from txbroker.service.clients import ClientRegistry
from txbroker.store.record import PROPERTY_REAL_TOPIC, decode_record

log = logging.getLogger(__name__)

#: Commands queued for one stream before it counts as not writable (a client that stopped
#: reading): the check service defers its checks rather than queueing without bound.
OUTBOX_LIMIT = 1024
_ids = itertools.count(1)


@dataclass
class Session:
    """One client id: its latest settings and when it was last heard from."""

    client_id: str
    settings: pb.Settings | None = None
    last_seen: float = field(default_factory=time.monotonic)
    channels: list[TelemetryChannel] = field(default_factory=list)

    @property
    def client_type(self) -> int:
        return self.settings.client_type if self.settings is not None else pb.CLIENT_TYPE_UNSPECIFIED

    def published_topics(self) -> list[str]:
        if self.settings is None or not self.settings.HasField("publishing"):
            return []
        return [t.name for t in self.settings.publishing.topics if t.name]


class TelemetryChannel:
    """One open Telemetry stream, with the face of a remoting connection that the check
    service uses (``id``, ``peer``, ``closed``, ``writable``, ``send_oneway``, ``attributes``):
    a CHECK_TRANSACTION_STATE request given to :meth:`send_oneway` goes out as a
    ``RecoverOrphanedTransactionCommand`` carrying the half's message and the transaction id
    the client's EndTransaction must name."""

    def __init__(self, session: Session, peer: str, to_pb: Callable[..., pb.Message]) -> None:
        self.id = f"grpc-{next(_ids)}"
        self.session = session
        self.peer = peer
        self.attributes: dict[str, Any] = {}
        self.closed = False
        self._to_pb = to_pb
        self._outbox: asyncio.Queue[spb.TelemetryCommand | None] = asyncio.Queue()

    @property
    def writable(self) -> bool:
        return not self.closed and self._outbox.qsize() < OUTBOX_LIMIT

    def send(self, command: spb.TelemetryCommand) -> None:
        """Queue ``command`` for the stream.  A client that stops reading while it keeps
        writing (settings answered) would grow the queue without bound: past twice
        :data:`OUTBOX_LIMIT` its stream is ended instead."""
        if self.closed:
            raise RuntimeError(f"telemetry stream of {self.session.client_id} is closed")
        if self._outbox.qsize() >= 2 * OUTBOX_LIMIT:
            log.warning("telemetry stream of %s (%s) closed: %d commands unread",
                        self.session.client_id, self.peer, self._outbox.qsize())
            self.close()
            raise RuntimeError(f"telemetry stream of {self.session.client_id} is not read")
        self._outbox.put_nowait(command)

    def send_later(self, delay: float, command: spb.TelemetryCommand) -> None:
        """:meth:`send` ``command`` after ``delay`` seconds, unless the stream closed by then."""
        def send() -> None:
            if not self.closed:
                with contextlib.suppress(RuntimeError):  # ended as not read: nothing to do
                    self.send(command)

        asyncio.get_running_loop().call_later(delay, send)

    def send_oneway(self, cmd: RemotingCommand) -> None:
        """A check-back (see the class docstring)."""
        record = decode_record(cmd.body)
        topic = record.properties.get(PROPERTY_REAL_TOPIC, record.topic)
        message = self._to_pb(record, topic=topic)
        self.send(spb.TelemetryCommand(
            status=pb.Status(code=pb.OK, message="OK"),
            recover_orphaned_transaction_command=spb.RecoverOrphanedTransactionCommand(
                message=message, transaction_id=cmd.ext_fields["offsetMsgId"])))

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self._outbox.put_nowait(None)

    async def outgoing(self) -> AsyncIterator[spb.TelemetryCommand]:
        """What to write on the stream, until :meth:`close`."""
        while (command := await self._outbox.get()) is not None:
            yield command


class Sessions:
    """Client id -> :class:`Session`; producers' channels registered with the client
    registry under each topic they publish (the producer group of their halves)."""

    def __init__(self, registry: ClientRegistry) -> None:
        self.registry = registry
        self._sessions: dict[str, Session] = {}

    def __len__(self) -> int:
        return len(self._sessions)

    def get(self, client_id: str) -> Session | None:
        return self._sessions.get(client_id)

    def touch(self, client_id: str) -> Session:
        session = self._sessions.get(client_id)
        if session is None:
            session = self._sessions[client_id] = Session(client_id)
        session.last_seen = time.monotonic()
        return session

    def open_channel(self, client_id: str, peer: str,
                     to_pb: Callable[..., pb.Message]) -> TelemetryChannel:
        session = self.touch(client_id)
        channel = TelemetryChannel(session, peer, to_pb)
        session.channels.append(channel)
        return channel

    def settings_received(self, channel: TelemetryChannel, settings: pb.Settings) -> None:
        session = channel.session
        session.settings = settings
        session.last_seen = time.monotonic()
        for topic in session.published_topics():
            self.registry.note_producer(topic, channel)

    def note_send(self, client_id: str, topic: str) -> None:
        """A producer sending to ``topic`` answers its checks (its settings may predate the
        topic: clients add topics as they send)."""
        session = self.touch(client_id)
        for channel in session.channels:
            if not channel.closed:
                self.registry.note_producer(topic, channel)

    def close_channel(self, channel: TelemetryChannel) -> None:
        channel.close()
        self.registry.connection_closed(channel)
        session = channel.session
        if channel in session.channels:
            session.channels.remove(channel)

    def terminate(self, client_id: str) -> None:
        """NotifyClientTermination: the client is gone, its streams with it."""
        session = self._sessions.pop(client_id, None)
        if session is None:
            return
        for channel in list(session.channels):
            self.close_channel(channel)

    def close_all(self) -> None:
        """Every open stream ends (the broker stops)."""
        for session in list(self._sessions.values()):
            for channel in list(session.channels):
                channel.close()

    def expire(self, idle_s: float) -> list[str]:
        """Forget clients silent for ``idle_s`` with no open stream (heartbeats come every
        10 s from every 5.x client)."""
        cutoff = time.monotonic() - idle_s
        gone = [cid for cid, s in self._sessions.items()
                if s.last_seen < cutoff and not any(not c.closed for c in s.channels)]
        for cid in gone:
            self.terminate(cid)
        return gone
