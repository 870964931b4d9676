"""The master side of commitlog replication (RocketMQ 5.x AutoSwitch HA, docs/cluster.md
"Replication (HA)").

Each slave connects to the HA port and sends a handshake; the master answers with its epoch
entries and max offset, the slave cuts what diverged and acks its offset, and from then on the
master streams raw commitlog bytes from the slave's acked offset (first ack 0: from the
master's min offset).  A batch is at most ~1 MiB, comes from one segment and never spans two
epochs; an idle connection gets an empty header every ``heartbeat`` seconds.  Acks drive
:meth:`HAMaster.wait_replicated`, the SYNC_MASTER wait.

New bytes are noticed through a store listener (every indexed append calls it) and a short
poll as a backstop for records no queue indexes.

**Who may follow.**  With a cluster ``secret`` a peer must pass the challenge-response of
:mod:`~txbroker.store.ha_codec` before it gets anything (not even the epoch entries); one that
does not is dropped with one line naming its address (repeats from the same address with the
same reason go to DEBUG).  The master proves itself in the same exchange, so a slave never
follows an impostor.  Without a secret any peer may follow, as in RocketMQ.

**A slave behind this log's start.**  A slave whose acked offset retention has deleted here
cannot follow: RocketMQ's master then sends heartbeats forever and the slave never moves.
This master tells it instead: an empty transfer header at this log's first offset (a RocketMQ
slave, too, refuses a header whose offset is not its own end), one line here, and the
connection ends; the slave says why and waits a long back-off (:mod:`.ha_slave`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from collections.abc import Awaitable, Callable, Collection
from dataclasses import dataclass
from typing import Any

from txbroker.store.ha_codec import (
    NONCE_SIZE,
    AuthChallenge,
    AuthHello,
    AuthProof,
    MasterHandshake,
    ProtocolError,
    SlaveAck,
    SlaveHandshake,
    SlaveStreamDecoder,
    encode_auth_challenge,
    encode_master_handshake,
    encode_transfer_header,
    master_proof,
    proof_matches,
    slave_proof,
)
from txbroker.store.message_store import MessageStore
from txbroker.store.results import PutStatus

log = logging.getLogger(__name__)

BATCH = 1024 * 1024
#: A slave further behind than this is not worth waiting for (RocketMQ ``haMaxGapNotInSync``).
MAX_GAP = 256 * 1024 * 1024
#: Addresses whose last drop reason is remembered (so a retrying peer is named once).
MAX_REMEMBERED_DROPS = 256


class PeerRefused(Exception):
    """A peer that may not follow (failed authentication, or needs bytes no longer held);
    the message says why and names it."""


class BehindLogStart(PeerRefused):
    """A slave's offset is below this log's first offset (retention deleted it)."""

    def __init__(self, message: str, min_offset: int) -> None:
        super().__init__(message)
        self.min_offset = min_offset


@dataclass
class SlaveInfo:
    slave_id: int
    address: str
    ack_offset: int = 0
    connected: bool = True
    #: ``clock()`` when an ack last reached the master's max offset (0: never).
    caught_up_at: float = 0.0


class HAMaster:
    """Serves slaves; one per master store.

    **One connection per slave id.**  A second connection that completes the handshake with
    the id of a live one *replaces* it (the older one is aborted).  The usual cause is the
    same slave reconnecting after a silent partition: its old connection looks alive here
    until ``idle_timeout`` passes, and refusing the new one would stall replication (and a
    SYNC_MASTER's sends) for that long.  Taking over an id was also what an impostor could do;
    with a cluster ``secret`` only a peer that knows the secret gets that far, so the
    replacement is safe.  Without a secret the cluster trusts its network, as RocketMQ does.
    """

    def __init__(self, store: MessageStore, *, host: str = "127.0.0.1", port: int = 0,
                 sock: object | None = None, heartbeat: float = 5.0, idle_timeout: float = 20.0,
                 poll: float = 0.05, clock: Callable[[], float] = time.monotonic,
                 group: str = "", secret: str | bytes | None = None,
                 start_server: Callable[..., Awaitable[Any]] | None = None) -> None:
        self.store = store
        #: How the HA port serves on ``sock``: ``start_server(callback, sock=sock)``, by default
        #: ``asyncio.start_server``; the broker passes one that speaks TLS
        #: (``txbroker.remoting.tls_listener.start_stream_server``), the store knowing nothing
        #: of certificates.
        self._start_server = start_server or asyncio.start_server
        #: The cluster secret slaves must prove they know (None: any peer may follow).
        self._secret = secret.encode() if isinstance(secret, str) else secret
        #: The broker group's name, so log lines name a slave as ``<group> id <n>``.
        self.group = group
        self.host, self.port, self._sock = host, port, sock
        self.heartbeat = heartbeat
        self.idle_timeout = idle_timeout
        self.poll = poll
        self.clock = clock
        #: An ``asyncio.Server`` or what ``start_server`` returned (``sockets``, ``close``,
        #: ``wait_closed``).
        self._server: Any = None
        self._infos: dict[int, SlaveInfo] = {}
        self._writers: dict[int, asyncio.StreamWriter] = {}
        #: peer host -> the last reason it was dropped for (logged once per change).
        self._drops: dict[str, str] = {}
        self._conns: set[asyncio.Task[None]] = set()
        self._waiters: list[tuple[int, int, asyncio.Future[PutStatus]]] = []
        #: :meth:`wait_acked` callers: (end offset, slave ids, future of the verdict).
        self._id_waiters: list[tuple[int, frozenset[int], asyncio.Future[bool]]] = []
        self._data = asyncio.Event()
        self._listening = False
        #: Called after every acknowledgement and disconnection, i.e. whenever
        #: :attr:`confirm_offset` may have moved (a SYNC_MASTER shows consumers up to it).
        self.on_confirm: Callable[[], None] | None = None

    # --- lifecycle ---------------------------------------------------------------------------
    async def start(self) -> tuple[str, int]:
        """Listen (on the socket given, else ``(host, port)``); returns the bound address."""
        if self._sock is not None:
            self._server = await self._start_server(self._serve, sock=self._sock)
        else:
            self._server = await asyncio.start_server(self._serve, self.host, self.port)
        if not self._listening:
            self.store.add_listener(self._on_append)
            self._listening = True
        addr = self._server.sockets[0].getsockname()
        self.host, self.port = addr[0], addr[1]
        return self.host, self.port

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for t in list(self._conns):
            t.cancel()
        for t in list(self._conns):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t
        if self._server is not None:
            with contextlib.suppress(Exception):
                await self._server.wait_closed()
            self._server = None
        for _, _, fut in self._waiters:
            if not fut.done():
                fut.set_result(PutStatus.FLUSH_SLAVE_TIMEOUT)
        self._waiters.clear()
        for _, _, verdict in self._id_waiters:
            if not verdict.done():
                verdict.set_result(False)
        self._id_waiters.clear()

    def _on_append(self, topic: str, queue_id: int, new_max: int) -> None:
        if not self._data.is_set():
            self._data.set()

    # --- what others read ----------------------------------------------------------------------
    def slaves(self) -> list[SlaveInfo]:
        return sorted(self._infos.values(), key=lambda i: i.slave_id)

    @property
    def confirm_offset(self) -> int:
        """What every connected slave holds (the master's max offset when none is connected)."""
        acks = [i.ack_offset for i in self._infos.values() if i.connected]
        end = self.store.max_physical_offset
        return min([end, *acks])

    def become(self, epoch: int) -> None:
        """This store starts being master under ``epoch``: record where that epoch begins."""
        if epoch <= self.store.epochs.last_epoch:
            raise ValueError(f"epoch {epoch} is not newer than {self.store.epochs.last_epoch}")
        self.store.epochs.append(epoch, self.store.max_physical_offset)
        self._data.set()

    def available(self, end_offset: int) -> int:
        """How many connected slaves are within 256 MiB of ``end_offset`` (worth waiting for)."""
        return sum(1 for i in self._infos.values()
                   if i.connected and end_offset - i.ack_offset < MAX_GAP)

    async def wait_replicated(self, end_offset: int, timeout: float, needed: int) -> PutStatus:
        """OK once ``needed`` slaves acked ``end_offset``; SLAVE_NOT_AVAILABLE at once when fewer
        than ``needed`` connected slaves are within 256 MiB of it; FLUSH_SLAVE_TIMEOUT after
        ``timeout`` seconds."""
        near = [i for i in self._infos.values() if i.connected and end_offset - i.ack_offset < MAX_GAP]
        if len(near) < needed:
            return PutStatus.SLAVE_NOT_AVAILABLE
        if sum(1 for i in near if i.ack_offset >= end_offset) >= needed:
            return PutStatus.OK
        fut: asyncio.Future[PutStatus] = asyncio.get_running_loop().create_future()
        entry = (end_offset, needed, fut)
        self._waiters.append(entry)
        self._data.set()
        try:
            return await asyncio.wait_for(asyncio.shield(fut), timeout)
        except TimeoutError:
            return PutStatus.FLUSH_SLAVE_TIMEOUT
        finally:
            with contextlib.suppress(ValueError):
                self._waiters.remove(entry)

    async def wait_acked(self, end_offset: int, slave_ids: Collection[int], timeout: float) -> bool:
        """True once every slave in ``slave_ids`` acked ``end_offset`` (an ack given on a
        connection since lost counts: those bytes are held there); False after ``timeout``
        seconds, or as soon as one that lacks it has no connection (it cannot ack without one,
        and a reconnection is not waited for).  No ids: True."""
        ids = frozenset(slave_ids)
        verdict = self._acked(end_offset, ids)
        if verdict is not None:
            return verdict
        fut: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        entry = (end_offset, ids, fut)
        self._id_waiters.append(entry)
        self._data.set()
        try:
            return await asyncio.wait_for(asyncio.shield(fut), timeout)
        except TimeoutError:
            return False
        finally:
            with contextlib.suppress(ValueError):
                self._id_waiters.remove(entry)

    def _acked(self, end_offset: int, ids: frozenset[int]) -> bool | None:
        """:meth:`wait_acked`'s verdict now: True, False, or None (still waiting)."""
        waiting = False
        for slave_id in ids:
            info = self._infos.get(slave_id)
            if info is not None and info.ack_offset >= end_offset:
                continue
            if info is None or not info.connected:
                return False
            waiting = True
        return None if waiting else True

    def _wake_waiters(self) -> None:
        acks = [i.ack_offset for i in self._infos.values() if i.connected]
        for end, needed, fut in self._waiters:
            if not fut.done() and sum(1 for a in acks if a >= end) >= needed:
                fut.set_result(PutStatus.OK)
        for end, ids, verdict in self._id_waiters:
            if not verdict.done():
                got = self._acked(end, ids)
                if got is not None:
                    verdict.set_result(got)

    # --- one slave ---------------------------------------------------------------------------------
    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._conns.add(task)
        peer = writer.get_extra_info("peername")
        address = f"{peer[0]}:{peer[1]}" if peer else "?"
        info: SlaveInfo | None = None
        sender: asyncio.Task[None] | None = None
        decoder = SlaveStreamDecoder()
        try:
            hello = await self._greet(reader, writer, decoder, address)
            store = self.store
            writer.write(encode_master_handshake(MasterHandshake(
                store.max_physical_offset, store.epochs.last_epoch, list(store.epochs.entries))))
            await writer.drain()
            first = await self._read_within(reader, decoder)
            if not isinstance(first, SlaveAck):
                raise ProtocolError(f"expected an ack, got {type(first).__name__}")
            start = first.max_offset or store.min_physical_offset
            if hello.sync_from_last_file and not first.max_offset:
                end = store.max_physical_offset
                start = max(store.min_physical_offset, end - end % store.config.segment_size)
            if start < store.min_physical_offset:
                await self._refuse_behind(writer, hello.slave_id, start)
            info = SlaveInfo(hello.slave_id, address, first.max_offset)
            old = self._infos.get(hello.slave_id)
            if old is not None and old.connected:
                log.warning("HA slave %s connected again from %s: the older connection (from %s) "
                            "is closed", self._slave(hello.slave_id), address, old.address)
                old.connected = False
                older = self._writers.get(hello.slave_id)
                if older is not None:
                    older.transport.abort()
            self._infos[hello.slave_id] = info
            self._writers[hello.slave_id] = writer
            self._ack(info, first.max_offset)
            self._drops.pop(str(peer[0]) if peer else "?", None)
            log.info("HA slave %s (from %s) follows from offset %d", self._slave(hello.slave_id),
                     address, start)
            sender = asyncio.create_task(self._send(writer, start, info))
            # A sender that stops (its offset deleted by retention) ends the connection.
            sender.add_done_callback(lambda _: writer.transport.abort())
            while True:
                msg = await self._read_within(reader, decoder)
                if not isinstance(msg, SlaveAck):
                    raise ProtocolError(f"expected an ack, got {type(msg).__name__}")
                self._ack(info, msg.max_offset)
        except PeerRefused as exc:
            self._dropped(peer, f"HA peer at {address} dropped: {exc}")
        except (ProtocolError, ValueError) as exc:
            log.warning("HA slave at %s dropped: %s", address, exc)
        except TimeoutError:
            log.info("HA slave at %s disconnected: nothing received for %g s", address,
                     self.idle_timeout)
        except OSError as exc:
            log.info("HA slave at %s disconnected: %s", address, exc or type(exc).__name__)
        except asyncio.CancelledError:
            pass  # close(): asyncio's server callback must not see a cancelled handler task
        finally:
            if sender is not None:
                sender.cancel()
                try:
                    await sender
                except (asyncio.CancelledError, ConnectionError):
                    pass
                except BehindLogStart as exc:
                    self._dropped(peer, f"HA slave at {address}: sending stopped: {exc}")
                except (ValueError, OSError) as exc:
                    log.warning("HA slave at %s: sending stopped: %s", address, exc)
            if info is not None and self._infos.get(info.slave_id) is info:
                info.connected = False
                self._writers.pop(info.slave_id, None)
                if self._id_waiters:
                    self._wake_waiters()  # a slave waited for can no longer ack
                if self.on_confirm is not None:
                    self.on_confirm()
            writer.close()
            self._conns.discard(task)

    async def _greet(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                     decoder: SlaveStreamDecoder, address: str) -> SlaveHandshake:
        """Read the slave's handshake, after its proof when a secret is set; PeerRefused when
        it may not follow.  Nothing of the log is sent before this returns."""
        first = await self._read_within(reader, decoder)
        if self._secret is None:
            if isinstance(first, AuthHello):
                raise PeerRefused("it asked to authenticate, but no cluster_secret is set on "
                                  "this broker (set the same one on every broker of the group)")
            if not isinstance(first, SlaveHandshake):
                raise ProtocolError(f"expected a handshake, got {type(first).__name__}")
            return first
        if not isinstance(first, AuthHello):
            raise PeerRefused("it did not authenticate (cluster_secret is set on this broker; "
                              "is it set, the same, on that one?)")
        nonce = secrets.token_bytes(NONCE_SIZE)
        challenge = AuthChallenge(nonce, master_proof(self._secret, first.nonce, nonce))
        writer.write(encode_auth_challenge(challenge))
        await writer.drain()
        proof = await self._read_within(reader, decoder)
        if not isinstance(proof, AuthProof):
            raise PeerRefused(f"it sent {type(proof).__name__} instead of its proof")
        if not proof_matches(slave_proof(self._secret, nonce, first.nonce, proof.slave_id), proof.proof):
            raise PeerRefused(f"it failed authentication as slave id {proof.slave_id} (wrong "
                              f"cluster_secret)")
        hello = await self._read_within(reader, decoder)
        if not isinstance(hello, SlaveHandshake):
            raise ProtocolError(f"expected a handshake, got {type(hello).__name__}")
        if hello.slave_id != proof.slave_id:
            raise PeerRefused(f"it proved slave id {proof.slave_id} but its handshake says "
                              f"{hello.slave_id}")
        return hello

    async def _refuse_behind(self, writer: asyncio.StreamWriter, slave_id: int, offset: int) -> None:
        """Tell a slave that needs ``offset`` where this log starts now, then end (raises)."""
        store = self.store
        low = store.min_physical_offset
        epoch, epoch_start, _ = store.epochs.entry_at(low)
        writer.write(encode_transfer_header(low, 0, epoch, epoch_start, self.confirm_offset))
        with contextlib.suppress(OSError):
            await writer.drain()
        raise BehindLogStart(f"slave {self._slave(slave_id)} needs offset {offset}, but this log "
                             f"now starts at {low} (retention deleted the rest): it cannot "
                             f"follow until its data directory is rebuilt from this master", low)

    def _dropped(self, peer: object, line: str) -> None:
        """One line per peer host and reason; the same again from the same host at DEBUG."""
        host = str(peer[0]) if isinstance(peer, tuple) else "?"
        reason = line.split(": ", 1)[-1]
        if self._drops.get(host) == reason:
            log.debug("%s", line)
            return
        if len(self._drops) >= MAX_REMEMBERED_DROPS:
            self._drops.pop(next(iter(self._drops)))
        self._drops[host] = reason
        log.warning("%s", line)

    async def _read_within(self, reader: asyncio.StreamReader, decoder: SlaveStreamDecoder
                           ) -> SlaveHandshake | SlaveAck | AuthHello | AuthProof:
        """The slave's next frame, or TimeoutError after ``idle_timeout``.  asyncio.timeout,
        not wait_for: on Python 3.11 wait_for drops a cancellation that arrives together with
        the frame, so a connection's loop would go on reading acks and :meth:`close`, which
        awaits it, would wait as long as the slave keeps following."""
        async with asyncio.timeout(self.idle_timeout):
            return await self._read_one(reader, decoder)

    async def _read_one(self, reader: asyncio.StreamReader, decoder: SlaveStreamDecoder
                        ) -> SlaveHandshake | SlaveAck | AuthHello | AuthProof:
        while True:
            msg = decoder.next()
            if msg is not None:
                return msg
            data = await reader.read(4096)
            if not data:
                raise ConnectionError("the slave closed the connection")
            decoder.feed(data)

    def _slave(self, slave_id: int) -> str:
        return f"{self.group} id {slave_id}" if self.group else f"id {slave_id}"

    def _ack(self, info: SlaveInfo, offset: int) -> None:
        end = self.store.max_physical_offset
        if offset > end:
            raise ValueError(f"slave {info.slave_id} acked {offset}, past the master's end {end}")
        info.ack_offset = offset
        if offset >= end:
            info.caught_up_at = self.clock()
        if self._waiters or self._id_waiters:
            self._wake_waiters()
        if self.on_confirm is not None:
            self.on_confirm()

    async def _send(self, writer: asyncio.StreamWriter, offset: int, info: SlaveInfo) -> None:
        """Stream from ``offset`` forever: batches while there are bytes, heartbeats when idle."""
        store = self.store
        last_write = 0.0
        while True:
            commitlog = store.commitlog
            assert commitlog is not None
            self._data.clear()
            epoch, epoch_start, epoch_end = store.epochs.entry_at(offset)
            n = 0
            if offset < commitlog.max_offset:
                seg = commitlog.segment_at(offset)
                if seg is None:
                    # Retention deleted it under a slave that fell behind.
                    await self._refuse_behind(writer, info.slave_id, offset)
                stop = seg.start + seg.wrote
                if epoch_end is not None:
                    stop = min(stop, epoch_end)
                n = min(stop - offset, BATCH)
            now = time.monotonic()
            if n > 0:
                body = seg.read(offset - seg.start, n)
                writer.write(encode_transfer_header(offset, n, epoch, epoch_start, self.confirm_offset))
                writer.write(body)
                offset += n
                last_write = now
                await writer.drain()
                continue
            if now - last_write >= self.heartbeat:
                writer.write(encode_transfer_header(offset, 0, epoch, epoch_start, self.confirm_offset))
                last_write = now
                await writer.drain()
            with contextlib.suppress(TimeoutError):  # asyncio.timeout: see _read_within
                async with asyncio.timeout(min(self.poll, self.heartbeat)):
                    await self._data.wait()
