"""The slave side of commitlog replication (docs/cluster.md, "Replication (HA)").

Connect to the master's HA address (asked of a callable each time: a failover changes it),
send a handshake, read the master's epoch entries, cut this log back to the last point where
both agree (:func:`txbroker.store.epochs.find_consistent_point`), ack that offset, then append
every transferred batch at exactly this log's end and ack the new end.  A slave never acks
bytes it does not hold.  Any error closes the connection; the next attempt waits a back-off
that doubles up to ``max_backoff``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable

from txbroker.store.ha_codec import (
    MasterHandshake,
    MasterStreamDecoder,
    ProtocolError,
    SlaveHandshake,
    Transfer,
    encode_ack,
    encode_slave_handshake,
)
from txbroker.store.message_store import MessageStore

log = logging.getLogger(__name__)

Address = str | tuple[str, int] | None


def _split(addr: Address) -> tuple[str, int] | None:
    if not addr:
        return None
    if isinstance(addr, tuple):
        return addr
    host, sep, port = addr.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"HA master address {addr!r} is not host:port")
    return host, int(port)


class HASlave:
    """Follows one master at a time; :meth:`start` runs it in the background."""

    def __init__(self, store: MessageStore, master_addr: Callable[[], Address], *, slave_id: int = 1,
                 heartbeat: float = 5.0, idle_timeout: float = 20.0, backoff: float = 0.05,
                 max_backoff: float = 5.0, master_name: Callable[[], str] | None = None) -> None:
        self.store = store
        self.master_addr = master_addr
        #: How log lines name the master (the broker's ``name@address``); its HA address
        #: when the caller cannot tell.
        self.master_name = master_name
        self.slave_id = slave_id
        self.heartbeat = heartbeat
        self.idle_timeout = idle_timeout
        self.backoff = backoff
        self.max_backoff = max_backoff
        #: The master's epoch in the last message read (0 before any).
        self.master_epoch = 0
        #: The master's confirm offset from the last header, capped at what this log holds.
        self.confirm_offset = 0
        #: Sessions completed a handshake (tests and operators watch reconnects).
        self.sessions = 0
        self._master_end = 0
        self._task: asyncio.Task[None] | None = None
        self.connected = False

    @property
    def lag(self) -> int:
        """Bytes behind the furthest master offset seen (handshake or transfer header)."""
        return max(0, self._master_end - self.store.max_physical_offset)

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="txbroker-ha-slave")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def _run(self) -> None:
        delay = self.backoff
        while True:
            try:
                addr = _split(self.master_addr())
                if addr is not None:
                    await self._session(addr)
                    delay = self.backoff
            except asyncio.CancelledError:
                raise
            except TimeoutError:
                log.info("HA connection to the master ended: nothing received for %g s",
                         self.idle_timeout)
            except (OSError, ProtocolError, ValueError) as exc:
                log.info("HA connection to the master ended: %s", exc or type(exc).__name__)
            finally:
                self.connected = False
            await asyncio.sleep(delay)
            delay = min(delay * 2, self.max_backoff)

    async def _session(self, addr: tuple[str, int]) -> None:
        reader, writer = await asyncio.open_connection(*addr)
        try:
            where = f"{addr[0]}:{addr[1]}"
            if self.master_name is not None:
                where = f"{self.master_name()} (HA {where})"
            await self._follow(reader, writer, where)
        finally:
            writer.close()

    async def _follow(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, where: str) -> None:
        store = self.store
        decoder = MasterStreamDecoder()
        writer.write(encode_slave_handshake(SlaveHandshake(self.slave_id)))
        hello = await self._read_one(reader, decoder)
        if not isinstance(hello, MasterHandshake):
            raise ProtocolError(f"master {where} sent {type(hello).__name__} before its handshake")
        cut = self._truncate(hello, where)
        if cut or not self.sessions:
            log.info("now following %s from offset %d, truncated %d bytes", where,
                     store.max_physical_offset, cut)
        self.master_epoch = hello.last_epoch
        self._master_end = hello.max_offset
        acked = store.max_physical_offset
        writer.write(encode_ack(acked))
        await writer.drain()
        self.connected = True
        self.sessions += 1
        last_ack = time.monotonic()
        while True:
            msg = await asyncio.wait_for(self._read_one(reader, decoder), self.idle_timeout)
            if not isinstance(msg, Transfer):
                raise ProtocolError(f"master {where} sent a second handshake")
            self._apply(msg, where)
            end = store.max_physical_offset
            now = time.monotonic()
            if end != acked or now - last_ack >= self.heartbeat:
                writer.write(encode_ack(end))
                acked, last_ack = end, now
                await writer.drain()

    def _truncate(self, hello: MasterHandshake, where: str) -> int:
        """Cut this log to the last point it shares with the master (no epochs here: nothing);
        returns the bytes cut."""
        store = self.store
        local_end = store.max_physical_offset
        if not store.epochs.entries or local_end == 0:
            return 0
        point = store.epochs.find_consistent_point(hello.epochs, local_end, hello.max_offset)
        if point < 0:
            raise ProtocolError(f"no epoch in common with master {where}: local {store.epochs.entries}, "
                                f"master {hello.epochs}")
        if point >= local_end:
            return 0
        log.warning("HA: cutting this log from offset %d to %d (%d bytes) to follow %s",
                    local_end, point, local_end - point, where)
        store.truncate(point)
        return local_end - point

    def _apply(self, msg: Transfer, where: str) -> None:
        store = self.store
        self.master_epoch = max(self.master_epoch, msg.epoch)
        self._master_end = max(self._master_end, msg.offset + len(msg.body))
        if msg.body:
            end = store.max_physical_offset
            if end and msg.offset != end:
                raise ProtocolError(f"master {where} sent bytes at {msg.offset}, this log ends at {end}")
            if msg.epoch > store.epochs.last_epoch:
                store.epochs.append(msg.epoch, msg.epoch_start)
            store.append_replicated(msg.offset, msg.body)
        self.confirm_offset = min(msg.confirm_offset, store.max_physical_offset)

    async def _read_one(self, reader: asyncio.StreamReader, decoder: MasterStreamDecoder
                        ) -> MasterHandshake | Transfer:
        while True:
            msg = decoder.next()
            if msg is not None:
                return msg
            data = await reader.read(1 << 20)
            if not data:
                raise ConnectionError("the master closed the connection")
            decoder.feed(data)
