"""The slave side of commitlog replication (docs/cluster.md, "Replication (HA)").

Connect to the master's HA address (asked of a callable each time: a failover changes it),
send a handshake, read the master's epoch entries, cut this log back to the last point where
both agree (:func:`txbroker.store.epochs.find_consistent_point`), ack that offset, then append
every transferred batch at exactly this log's end and ack the new end.  A slave never acks
bytes it does not hold.  Any error closes the connection; the next attempt waits a back-off
that doubles up to ``max_backoff``.

**What a slave refuses** (:class:`FollowRefused`: one line, kept in :attr:`HASlave.problem`
for the status document, the same reason again only at DEBUG):

* a master whose last epoch is older than this log's: a stale master (one a failover has
  replaced and that does not know it yet) must never make this log cut what the newer master
  wrote.  Retried at the normal back-off, as a master just elected may not have written its
  epoch yet;
* a log with bytes but no epoch entries, when the master has some: nothing says where those
  bytes agree with the master's, and appending after them would glue two histories together
  at offsets that mean different records.  Cutting them to 0 is not this process's choice
  either: they may be messages acknowledged to producers and held nowhere else (a stand-alone
  broker's directory reused as a slave's, an epoch file removed by hand).  The operator moves
  the directory aside and the slave rebuilds from the master;
* a master that no longer holds this log's end (its first offset is past it: retention);
* with a cluster ``secret``, a master that cannot prove it knows it, or that does not answer
  the authentication at all (see :mod:`.ha_codec`).
The last three need an operator, so they are retried only every ``stalled_backoff``.
A master whose TLS certificate does not verify (``tls``) is refused the same way, in one
line naming its address and the reason, and retried at the normal back-off.

A follower task that fails for any other reason logs it with its traceback and starts over
after the back-off: it never dies silently.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import ssl
import time
from collections.abc import Callable

from txbroker.store.ha_codec import (
    NONCE_SIZE,
    AuthChallenge,
    AuthHello,
    AuthProof,
    MasterHandshake,
    MasterStreamDecoder,
    ProtocolError,
    SlaveHandshake,
    Transfer,
    encode_ack,
    encode_auth_hello,
    encode_auth_proof,
    encode_slave_handshake,
    master_proof,
    proof_matches,
    slave_proof,
)
from txbroker.store.message_store import MessageStore
from txbroker.store.reput import CorruptRecord

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


class FollowRefused(Exception):
    """This slave will not follow that master (see the module docstring); ``stalled``: only
    an operator can change that, so retry slowly."""

    def __init__(self, message: str, *, stalled: bool = True) -> None:
        super().__init__(message)
        self.stalled = stalled


class HASlave:
    """Follows one master at a time; :meth:`start` runs it in the background."""

    def __init__(self, store: MessageStore, master_addr: Callable[[], Address], *, slave_id: int = 1,
                 heartbeat: float = 5.0, idle_timeout: float = 20.0, backoff: float = 0.05,
                 max_backoff: float = 5.0, master_name: Callable[[], str] | None = None,
                 secret: str | bytes | None = None, stalled_backoff: float = 30.0,
                 tls: ssl.SSLContext | None = None) -> None:
        self.store = store
        #: TLS to the master's HA port (the broker's ``tls_peers``; None: plaintext), the
        #: master's certificate checked against the host name or IP address dialled.
        self.tls = tls
        #: The cluster secret the master must prove it knows (None: RocketMQ's plain stream).
        self._secret = secret.encode() if isinstance(secret, str) else secret
        self.stalled_backoff = stalled_backoff
        #: Why this slave does not follow now (None while it does, or before any attempt);
        #: shown in the broker's status document.
        self.problem: str | None = None
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
            pause: float | None = None
            try:
                addr = _split(self.master_addr())
                if addr is not None:
                    await self._session(addr)
                    delay = self.backoff
            except asyncio.CancelledError:
                raise
            except FollowRefused as exc:
                self._trouble(str(exc))
                if exc.stalled:
                    pause = self.stalled_backoff
            except TimeoutError:
                log.info("HA connection to the master ended: nothing received for %g s",
                         self.idle_timeout)
            except (OSError, ProtocolError, ValueError) as exc:
                log.info("HA connection to the master ended: %s", exc or type(exc).__name__)
            except Exception:
                log.exception("HA follower failed unexpectedly; it starts over in %g s", delay)
            finally:
                self.connected = False
            await asyncio.sleep(pause if pause is not None else delay)
            delay = min(delay * 2, self.max_backoff)

    def _trouble(self, problem: str) -> None:
        """Record why this slave does not follow; log it when it is news."""
        if problem != self.problem:
            log.warning("%s", problem)
        else:
            log.debug("%s", problem)
        self.problem = problem

    async def _session(self, addr: tuple[str, int]) -> None:
        try:
            reader, writer = await asyncio.open_connection(
                *addr, ssl=self.tls, server_hostname=addr[0] if self.tls else None)
        except ssl.SSLCertVerificationError as exc:
            # Not a master to follow until its certificate changes: said once, retried.
            raise FollowRefused(f"HA master {addr[0]}:{addr[1]}: certificate verify failed: "
                                f"{exc.verify_message}", stalled=False) from None
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
        if self._secret is not None:
            await self._authenticate(reader, writer, decoder, where)
        writer.write(encode_slave_handshake(SlaveHandshake(self.slave_id)))
        try:
            hello = await self._read_within(reader, decoder)
        except ConnectionError:
            if self._secret is not None:
                raise FollowRefused(f"HA master {where} refused this slave's authentication "
                                    f"(is its cluster_secret the same as this broker's?)") from None
            raise FollowRefused(f"HA master {where} closed the connection before its handshake "
                                f"(if it has a cluster_secret, set the same one here)") from None
        if isinstance(hello, AuthChallenge):
            raise FollowRefused(f"HA master {where} asks for authentication, but no cluster_secret "
                                f"is set on this broker: not followed")
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
            msg = await self._read_within(reader, decoder)
            if not isinstance(msg, Transfer):
                raise ProtocolError(f"master {where} sent a second handshake")
            self._apply(msg, where)
            if self.problem is not None:
                log.info("HA: following %s again", where)
                self.problem = None
            end = store.max_physical_offset
            now = time.monotonic()
            if end != acked or now - last_ack >= self.heartbeat:
                writer.write(encode_ack(end))
                acked, last_ack = end, now
                await writer.drain()

    async def _read_within(self, reader: asyncio.StreamReader,
                           decoder: MasterStreamDecoder) -> MasterHandshake | Transfer | AuthChallenge:
        """The master's next frame, or TimeoutError after ``idle_timeout``.  asyncio.timeout,
        not wait_for: on Python 3.11 wait_for drops a cancellation that arrives together with
        the frame, the follow loop then goes on and :meth:`close` waits for ever (seen as a
        300 s hang of tests/store/test_ha_trust.py)."""
        async with asyncio.timeout(self.idle_timeout):
            return await self._read_one(reader, decoder)

    async def _authenticate(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                            decoder: MasterStreamDecoder, where: str) -> None:
        """The challenge-response of :mod:`.ha_codec`: the master proves itself first, then
        this slave (its proof goes out just before its handshake)."""
        assert self._secret is not None
        nonce = secrets.token_bytes(NONCE_SIZE)
        writer.write(encode_auth_hello(AuthHello(nonce)))
        await writer.drain()
        try:
            challenge = await self._read_within(reader, decoder)
        except ConnectionError:
            raise FollowRefused(f"HA master {where} closed the connection instead of answering "
                                f"the authentication (is cluster_secret set there, the same as "
                                f"here?)") from None
        except ProtocolError as exc:
            raise FollowRefused(f"HA master {where} did not answer the authentication ({exc}): "
                                f"not followed") from None
        if not isinstance(challenge, AuthChallenge):
            raise FollowRefused(f"HA master {where} did not answer the authentication (it sent "
                                f"{type(challenge).__name__}; is cluster_secret set there?): "
                                f"not followed")
        if not proof_matches(master_proof(self._secret, nonce, challenge.nonce), challenge.proof):
            raise FollowRefused(f"HA master {where} failed authentication (wrong cluster_secret): "
                                f"not followed")
        proof = slave_proof(self._secret, challenge.nonce, nonce, self.slave_id)
        writer.write(encode_auth_proof(AuthProof(self.slave_id, proof)))

    def _truncate(self, hello: MasterHandshake, where: str) -> int:
        """Cut this log to the last point it shares with the master; returns the bytes cut.
        FollowRefused for a stale master, or a log that has bytes but no epoch history
        (module docstring)."""
        store = self.store
        local_end = store.max_physical_offset
        mine = store.epochs.last_epoch
        if hello.last_epoch < mine:
            raise FollowRefused(f"HA master {where} is stale: its last epoch {hello.last_epoch} is "
                                f"older than this log's {mine}; not followed", stalled=False)
        if not store.epochs.entries:
            if local_end and hello.epochs:
                raise FollowRefused(
                    f"HA: this log holds {local_end} bytes but no epoch entries, so nothing "
                    f"says where it agrees with master {where}'s; not followed (move "
                    f"{store.config.data_dir} aside to rebuild this replica from the master)")
            return 0
        if local_end == 0:
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
        end = store.max_physical_offset
        if not msg.body and end and msg.offset > end:
            # The master's way of saying its log now starts past this one's end.
            raise FollowRefused(f"HA master {where} no longer holds offset {end}, where this log "
                                f"ends: its log starts at {msg.offset} (retention deleted the "
                                f"rest); move {store.config.data_dir} aside to rebuild this "
                                f"replica from the master")
        self.master_epoch = max(self.master_epoch, msg.epoch)
        self._master_end = max(self._master_end, msg.offset + len(msg.body))
        if msg.body:
            if end and msg.offset != end:
                raise ProtocolError(f"master {where} sent bytes at {msg.offset}, this log ends at {end}")
            if msg.epoch > store.epochs.last_epoch:
                store.epochs.append(msg.epoch, msg.epoch_start)
            try:
                store.append_replicated(msg.offset, msg.body)
            except CorruptRecord as exc:
                # Keep only what was whole, so the next session asks for these bytes again.
                store.truncate(exc.offset)
                raise FollowRefused(f"HA master {where} sent a {exc}; this log is cut back to "
                                    f"{store.max_physical_offset} and asks again",
                                    stalled=False) from None
        self.confirm_offset = min(msg.confirm_offset, store.max_physical_offset)

    async def _read_one(self, reader: asyncio.StreamReader, decoder: MasterStreamDecoder
                        ) -> MasterHandshake | Transfer | AuthChallenge:
        while True:
            msg = decoder.next()
            if msg is not None:
                return msg
            data = await reader.read(1 << 20)
            if not data:
                raise ConnectionError("the master closed the connection")
            decoder.feed(data)
