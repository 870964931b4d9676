"""The one module that talks to etcd: a small asyncio client over etcd's v3 gRPC API.

The cluster keeps its own state (who leads each broker group, at which epoch, the in-sync
set) in etcd (docs/cluster.md, "Consensus on etcd").  Everything it needs is here, behind
five verbs: linearizable reads (:meth:`Etcd.get`, :meth:`Etcd.range`), transactions with
compares (:meth:`Etcd.txn`), leases (:meth:`Etcd.grant`, :meth:`Etcd.keep_alive`,
:meth:`Etcd.revoke`).

The messages and stubs are aetcd's, generated from etcd's own ``rpc.proto``; the channel is
ours, because a broker needs what aetcd's ``Client`` does not do:

* **several endpoints.**  Losing, pausing or isolating one etcd member must not cost a
  broker its lease, so a call that fails or is not answered within ``timeout`` moves the
  client to the next endpoint (a member cut off from its majority still accepts connections
  and never answers: only a time-out tells).  gRPC's own ``pick_first`` over a list would stay
  on such a member.
* **TLS and client certificates**, from the broker's peer TLS files.
* **the send time of a keep-alive**, which the master's fence counts from: an etcd TTL is a
  minimum, not a promise, so the holder counts its lease on its own monotonic clock
  (:mod:`txbroker.cluster.leadership`).

Reads and keep-alives are retried on the next endpoint within one call; a transaction is
not (it may have been applied before its answer was lost): it raises
:class:`EtcdUnavailable`, and every transaction this package sends is guarded by compares,
so the caller reads again and finds out.  Event-loop only.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import grpc
from aetcd.rpc import kv_pb2, rpc_pb2, rpc_pb2_grpc

log = logging.getLogger(__name__)

#: Compare targets and results, named as etcd names them.
EQUAL = rpc_pb2.Compare.EQUAL
GREATER = rpc_pb2.Compare.GREATER
LESS = rpc_pb2.Compare.LESS
NOT_EQUAL = rpc_pb2.Compare.NOT_EQUAL
#: Largest value this client writes (etcd's default request limit is 1.5 MiB).
MAX_VALUE_SIZE = 1024 * 1024


class EtcdError(Exception):
    """etcd refused a request (its words in the message), or it was misused."""


class EtcdUnavailable(EtcdError):
    """No endpoint answered in time; the message names every endpoint tried."""


@dataclass(frozen=True)
class KV:
    """One key as etcd holds it."""

    key: bytes
    value: bytes
    create_revision: int
    mod_revision: int
    version: int
    lease: int

    @classmethod
    def of(cls, kv: kv_pb2.KeyValue) -> KV:
        return cls(kv.key, kv.value, kv.create_revision, kv.mod_revision, kv.version, kv.lease)


@dataclass(frozen=True)
class TxnResult:
    succeeded: bool
    revision: int
    #: The kvs of every range request among the branch taken, in order.
    ranges: tuple[tuple[KV, ...], ...]


def compare_create(key: bytes, revision: int, result: int = EQUAL) -> rpc_pb2.Compare:
    """``create_revision(key) <result> revision`` (0: the key does not exist)."""
    return rpc_pb2.Compare(result=result, target=rpc_pb2.Compare.CREATE, key=key,
                           create_revision=revision)


def compare_mod(key: bytes, revision: int, result: int = EQUAL) -> rpc_pb2.Compare:
    """``mod_revision(key) <result> revision`` (0: the key does not exist)."""
    return rpc_pb2.Compare(result=result, target=rpc_pb2.Compare.MOD, key=key,
                           mod_revision=revision)


def compare_lease(key: bytes, lease: int, result: int = EQUAL) -> rpc_pb2.Compare:
    """``lease(key) <result> lease``: the key is bound to that lease."""
    return rpc_pb2.Compare(result=result, target=rpc_pb2.Compare.LEASE, key=key, lease=lease)


def put(key: bytes, value: bytes, lease: int = 0) -> rpc_pb2.RequestOp:
    if len(value) > MAX_VALUE_SIZE:
        raise EtcdError(f"value of {key!r} is {len(value)} bytes, more than {MAX_VALUE_SIZE}")
    return rpc_pb2.RequestOp(request_put=rpc_pb2.PutRequest(key=key, value=value, lease=lease))


def delete(key: bytes) -> rpc_pb2.RequestOp:
    return rpc_pb2.RequestOp(request_delete_range=rpc_pb2.DeleteRangeRequest(key=key))


def get(key: bytes, prefix: bool = False) -> rpc_pb2.RequestOp:
    return rpc_pb2.RequestOp(request_range=rpc_pb2.RangeRequest(
        key=key, range_end=prefix_end(key) if prefix else b""))


def prefix_end(prefix: bytes) -> bytes:
    """The range end that covers every key starting with ``prefix`` (etcd's rule)."""
    end = bytearray(prefix)
    for i in range(len(end) - 1, -1, -1):
        if end[i] < 0xFF:
            end[i] += 1
            return bytes(end[: i + 1])
    return b"\0"


def parse_endpoints(text: str) -> list[str]:
    """``h:p;h:p`` or ``h:p,h:p`` (``http://`` or ``https://`` prefixes allowed, as etcdctl
    writes them) as a list of ``host:port``."""
    out = []
    for part in text.replace(",", ";").split(";"):
        part = part.strip()
        for scheme in ("http://", "https://"):
            part = part.removeprefix(scheme)
        part = part.rstrip("/")
        if not part:
            continue
        host, sep, port = part.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"{part!r} is not host:port")
        out.append(part)
    return out


@dataclass(frozen=True)
class EtcdTLS:
    """PEM bytes for a TLS channel: the CA to verify members by, and this node's certificate
    and key when members require one (``--client-cert-auth``)."""

    ca: bytes | None
    cert: bytes | None = None
    key: bytes | None = None

    @classmethod
    def from_files(cls, ca: str | None, cert: str | None, key: str | None) -> EtcdTLS:
        def read(path: str | None) -> bytes | None:
            if path is None:
                return None
            with open(path, "rb") as f:
                return f.read()
        return cls(read(ca), read(cert), read(key))


class Etcd:
    """A client of one etcd cluster, given every member's client address."""

    def __init__(self, endpoints: Sequence[str], *, timeout: float = 1.0,
                 tls: EtcdTLS | None = None, user: str | None = None,
                 password: str | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if not endpoints:
            raise EtcdError("no etcd endpoint given")
        self.endpoints = list(endpoints)
        self.timeout = timeout
        self._tls = tls
        self._user = user
        self._password = password
        self._index = 0
        self._channel: grpc.aio.Channel | None = None
        self._metadata: tuple[tuple[str, str], ...] | None = None
        self._kv: rpc_pb2_grpc.KVStub | None = None
        self._lease: rpc_pb2_grpc.LeaseStub | None = None
        self._maintenance: rpc_pb2_grpc.MaintenanceStub | None = None
        #: The endpoint last answering (for log lines and ``txbroker status``).
        self.current = self.endpoints[0]
        self._closed = False
        #: What a keep-alive's sending time is read from (the caller's monotonic clock).
        self._clock = clock

    # --- the channel -------------------------------------------------------------------------
    async def _connect(self) -> None:
        if self._channel is not None:
            return
        if self._closed:
            raise EtcdError("etcd client is closed")
        target = self.endpoints[self._index % len(self.endpoints)]
        options = [("grpc.enable_retries", 0), ("grpc.keepalive_time_ms", 10_000)]
        if self._tls is not None:
            creds = grpc.ssl_channel_credentials(self._tls.ca, self._tls.key, self._tls.cert)
            channel = grpc.aio.secure_channel(target, creds, options=options)
        else:
            channel = grpc.aio.insecure_channel(target, options=options)
        metadata = None
        if self._user is not None:
            try:
                resp = await rpc_pb2_grpc.AuthStub(channel).Authenticate(
                    rpc_pb2.AuthenticateRequest(name=self._user, password=self._password or ""),
                    timeout=self.timeout)
            except BaseException:
                await channel.close(grace=None)
                self.current = target
                raise
            metadata = (("token", resp.token),)
        self._channel, self.current, self._metadata = channel, target, metadata
        self._kv = rpc_pb2_grpc.KVStub(channel)
        self._lease = rpc_pb2_grpc.LeaseStub(channel)
        self._maintenance = rpc_pb2_grpc.MaintenanceStub(channel)

    async def _next_endpoint(self, channel: grpc.aio.Channel | None) -> None:
        """Drop ``channel`` and move on, unless another call already did (None: the
        connection itself failed, so move on)."""
        if channel is None:
            self._index += 1
        elif channel is self._channel:
            self._channel = None
            self._index += 1
            await channel.close(grace=None)

    async def close(self) -> None:
        self._closed = True
        channel, self._channel = self._channel, None
        if channel is not None:
            await channel.close(grace=None)

    async def _call(self, what: str, fn, *, retry: bool = True):
        """Run ``fn()`` (one RPC on the current stubs) with the time-out; on no answer or
        an unavailable member, move to the next endpoint and (``retry``) try again there,
        each endpoint once."""
        failures = []
        attempts = len(self.endpoints) if retry else 1
        reauthenticated = False
        while attempts > 0:
            attempts -= 1
            channel = None
            try:
                await asyncio.wait_for(self._connect(), self.timeout)
                channel = self._channel
                return await fn()
            except grpc.aio.AioRpcError as exc:
                code = exc.code()
                if code is grpc.StatusCode.UNAUTHENTICATED and self._user is not None \
                        and "token" in (exc.details() or "") and not reauthenticated:
                    # etcd's token expired (simple tokens live 5 minutes): a new channel
                    # authenticates again, on the same endpoint; the request was refused, not
                    # applied, so sending it again is safe even for a transaction.
                    reauthenticated = True
                    attempts += 1
                    if channel is not None and channel is self._channel:
                        self._channel = None
                        await channel.close(grace=None)
                    failures.append(f"{self.current}: auth token expired")
                    continue
                if code not in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED,
                                grpc.StatusCode.CANCELLED, grpc.StatusCode.UNKNOWN):
                    raise EtcdError(f"etcd {self.current} refused {what}: {code.name} "
                                    f"{exc.details() or ''}".rstrip()) from None
                failures.append(f"{self.current}: {code.name} {exc.details() or ''}".rstrip())
            except (TimeoutError, OSError) as exc:
                failures.append(f"{self.current}: {exc or type(exc).__name__}")
            except asyncio.CancelledError:
                task = asyncio.current_task()
                if task is None or task.cancelling():
                    raise  # this call was cancelled by its caller
                # Another call failed on the channel this one used and dropped it, which
                # cancels every call on it: a failure of that member, not a cancellation of
                # the caller (ending a renewal loop that way would end it for good).
                failures.append(f"{self.current}: the channel was dropped by another call")
            except grpc.aio.UsageError:  # dropped between this call's connect and its start
                failures.append(f"{self.current}: the channel was dropped by another call")
            await self._next_endpoint(channel)
        raise EtcdUnavailable(f"etcd did not answer {what} ({'; '.join(failures)})")

    # --- the verbs ---------------------------------------------------------------------------
    async def get(self, key: bytes) -> KV | None:
        """The key now (a linearizable read), or None."""
        kvs, _ = await self.range(key, prefix=False)
        return kvs[0] if kvs else None

    async def range(self, key: bytes, *, prefix: bool = True) -> tuple[list[KV], int]:
        """Every key under ``key`` (or the one key) and the revision read at."""
        req = rpc_pb2.RangeRequest(key=key, range_end=prefix_end(key) if prefix else b"")

        async def call():
            assert self._kv is not None
            return await self._kv.Range(req, timeout=self.timeout, metadata=self._metadata)
        resp = await self._call(f"a read of {key!r}", call)
        return [KV.of(kv) for kv in resp.kvs], resp.header.revision

    async def txn(self, compare: Sequence[rpc_pb2.Compare], success: Sequence[rpc_pb2.RequestOp],
                  failure: Sequence[rpc_pb2.RequestOp] = ()) -> TxnResult:
        """One etcd transaction; not retried (see the module docstring)."""
        req = rpc_pb2.TxnRequest(compare=list(compare), success=list(success),
                                 failure=list(failure))

        async def call():
            assert self._kv is not None
            return await self._kv.Txn(req, timeout=self.timeout, metadata=self._metadata)
        resp = await self._call("a transaction", call, retry=False)
        ranges = tuple(tuple(KV.of(kv) for kv in r.response_range.kvs) for r in resp.responses
                       if r.WhichOneof("response") == "response_range")
        return TxnResult(resp.succeeded, resp.header.revision, ranges)

    async def grant(self, ttl: int) -> tuple[int, int]:
        """A new lease of ``ttl`` seconds: (its id, the TTL etcd granted)."""
        async def call():
            assert self._lease is not None
            return await self._lease.LeaseGrant(rpc_pb2.LeaseGrantRequest(TTL=ttl),
                                                timeout=self.timeout, metadata=self._metadata)
        resp = await self._call("a lease grant", call)
        if resp.error:
            raise EtcdError(f"etcd {self.current} refused a lease: {resp.error}")
        return resp.ID, resp.TTL

    async def keep_alive(self, lease: int) -> tuple[float, int]:
        """Renew ``lease`` once: (the monotonic time the renewal that got the answer was
        *sent*, the TTL etcd now gives it; 0 or less: the lease is gone)."""
        sent = 0.0

        async def call():
            nonlocal sent
            assert self._lease is not None
            sent = self._clock()
            stream = self._lease.LeaseKeepAlive(iter([rpc_pb2.LeaseKeepAliveRequest(ID=lease)]),
                                                timeout=self.timeout, metadata=self._metadata)
            async for reply in stream:
                return reply
            raise grpc.aio.AioRpcError(grpc.StatusCode.UNAVAILABLE, grpc.aio.Metadata(),
                                       grpc.aio.Metadata(), "keep-alive stream ended")
        reply = await self._call("a lease keep-alive", call)
        return sent, reply.TTL

    async def revoke(self, lease: int) -> None:
        """End ``lease`` now: every key bound to it is deleted (a clean stop's hand-over)."""
        async def call():
            assert self._lease is not None
            return await self._lease.LeaseRevoke(rpc_pb2.LeaseRevokeRequest(ID=lease),
                                                 timeout=self.timeout, metadata=self._metadata)
        try:
            await self._call("a lease revoke", call)
        except EtcdError as exc:
            if "not found" not in str(exc):
                raise

    async def status(self) -> rpc_pb2.StatusResponse:
        """The current member's status (its leader, raft term): for tests and ``status``."""
        async def call():
            assert self._maintenance is not None
            return await self._maintenance.Status(rpc_pb2.StatusRequest(), timeout=self.timeout,
                                                  metadata=self._metadata)
        return await self._call("a status request", call)
