"""The broker's side of membership: register with every name server, keep registering, and
unregister on a clean stop (docs/cluster.md, "Name servers and membership").

As in RocketMQ, name servers do not talk to each other, so the broker registers with *each* of
``config.namesrv_addr``: all in parallel at start (``start`` returns once every one answered,
failed or timed out, so routes exist by the time the broker says it is ready), then every
``config.register_interval``, and at once when :meth:`BrokerRegistrar.trigger` is called (a
topic created or deleted, a role changed).  Every registration carries the whole topic table
with its DataVersion; the name server applies the table only when the version changed.

A name server that is down never holds the broker up: each call is bounded, failures are logged
once per change of state (down, then back), and the next round retries.  One
:class:`RemotingClient` per name server keeps its connection open between rounds because the
name server drops a broker whose registration connection closes; the client reconnects when a
name server comes back.  With ``tls`` (the broker's
:class:`~txbroker.remoting.tls.PeerTLS` context) the connections are TLS; a name server whose certificate does not verify
is one warning naming it and the reason, and is retried like one that is down.

With ``cluster_secret`` set, REGISTER_BROKER and UNREGISTER_BROKER go in the cluster envelope
(:mod:`.cluster_auth`: a timestamp, a nonce and an HMAC over the named fields and body), so a
name server holding the same secret obeys this broker, once per request, and no one without
it.  A signed answer (from a name server with the secret) must be signed over the request's
nonce or it is not believed; an unsigned one is taken as it is, because a name server may run
without a secret (RocketMQ's has none) while the brokers carry one for the controller: what a
slave takes from it, its master's HA address, leads nowhere without the HA stream's own proof
of the secret.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

from txbroker.config import BrokerConfig, parse_address_list
from txbroker.remoting.bodies import (
    DataVersion,
    RegisterBrokerBody,
    TopicConfigData,
    TopicConfigSerializeWrapper,
    body_crc32,
)
from txbroker.remoting.client import RemotingClient
from txbroker.remoting.codes import RequestCode, ResponseCode
from txbroker.remoting.command import RemotingCommand
from txbroker.remoting.envelope import is_signed
from txbroker.remoting.headers import (
    RegisterBrokerRequestHeader,
    RegisterBrokerResponseHeader,
    UnRegisterBrokerRequestHeader,
)
from txbroker.remoting.tls import link_failure
from txbroker.service.cluster_auth import check_answer, sign_request

log = logging.getLogger(__name__)

#: RocketMQ's registerBrokerTimeoutMills: one registration round waits at most this per server.
REGISTER_TIMEOUT = 6.0
#: Unregistration at stop waits at most this (RocketMQ: 3 s), all name servers in parallel.
UNREGISTER_TIMEOUT = 3.0

TopicTable = Callable[[], tuple[DataVersion, Mapping[str, Any]]]


class BrokerRegistrar:
    """Registers one broker with every name server of ``config.namesrv_addr``.

    ``identity()`` is the broker id to register under now (0 = master; None = not now: a
    controller-mode broker that does not know its role yet) and ``topic_table()``
    the DataVersion and topics (anything with TopicConfig's attributes) to announce: callables,
    so a broker that changes role or topics registers what it is at that moment.  ``on_master``
    receives (masterAddr, haServerAddr) from the first name server that names the group's
    master in answer to a slave's registration.  ``epoch()``, when given, is the master epoch
    the broker leads or follows, sent as the DataVersion's ``stateVersion`` so that name
    servers order id-0 registrations by it.
    """

    def __init__(self, config: BrokerConfig, *, broker_addr: str, ha_addr: str,
                 identity: Callable[[], int | None], topic_table: TopicTable,
                 on_master: Callable[[str, str], None] | None = None,
                 epoch: Callable[[], int] | None = None,
                 compressed: bool = False, tls: ssl.SSLContext | None = None) -> None:
        self.config = config
        self.broker_addr = broker_addr
        self.ha_addr = ha_addr
        self.identity = identity
        self.topic_table = topic_table
        self.on_master = on_master
        self.epoch = epoch
        self.compressed = compressed
        self.namesrv_addrs = parse_address_list(config.namesrv_addr)
        self._clients = {addr: RemotingClient(addr, ssl=tls)
                         for addr in self.namesrv_addrs}
        #: name-server address -> whether the last registration there succeeded (None = not yet).
        self.registered: dict[str, bool | None] = dict.fromkeys(self.namesrv_addrs)
        #: Completed registration rounds (a round = one attempt at every name server).
        self.rounds = 0
        #: The id the last round registered under (None: not registered).
        self.registered_as: int | None = None
        self._wake = asyncio.Event()
        self._task: asyncio.Task | None = None
        self._closed = False

    async def start(self) -> None:
        """Register once with every name server (bounded), then keep registering."""
        await self.register_all()
        self._task = asyncio.create_task(self._loop(), name="txbroker-registration")

    def trigger(self) -> None:
        """Register again now (topic table or role changed)."""
        self._wake.set()

    async def stop(self) -> None:
        """Stop registering and unregister from every name server, bounded in time."""
        self._closed = True
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        await self._unregister_all()
        await asyncio.gather(*(c.close() for c in self._clients.values()))

    async def _unregister_all(self) -> None:
        """Take this broker's entry (under the id it last registered) off every name server."""
        if self.registered_as is None:
            return
        header = UnRegisterBrokerRequestHeader(
            broker_name=self.config.broker_name, broker_addr=self.broker_addr,
            cluster_name=self.config.cluster_name, broker_id=self.registered_as)
        self.registered_as = None
        await asyncio.gather(*(self._unregister(c, header) for c in self._clients.values()))

    async def _loop(self) -> None:
        # Its own task, so asyncio.timeout: Python 3.11's wait_for swallows a cancellation that
        # arrives as the event is set (a role change triggering a round while the broker
        # stops), and the stop would wait for this loop for ever.  ``_closed`` ends it too.
        while not self._closed:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.config.register_interval):
                    await self._wake.wait()
            self._wake.clear()
            if self._closed:
                return
            try:
                await self.register_all()
            except Exception:
                log.exception("registration round failed")

    async def register_all(self) -> None:
        """One round: the current table to every name server in parallel; with no id to
        register under, the entry of an earlier round is taken off instead (an id this
        broker no longer owns may be another broker's now)."""
        broker_id = self.identity()
        if broker_id is None:
            if self.registered_as is not None:
                log.info("%s unregisters from the name servers until its role is known",
                         self.config.broker_name)
            await self._unregister_all()
            self.rounds += 1
            return
        version, table = self.topic_table()
        if self.epoch is not None:
            # RocketMQ 5's stateVersion: name servers keep the newest master's id-0 entry.
            version = replace(version, state_version=self.epoch())
        body = RegisterBrokerBody(TopicConfigSerializeWrapper(
            version, {name: TopicConfigData.of(tc) for name, tc in table.items()}))
        data = body.encode(compressed=self.compressed)
        header = RegisterBrokerRequestHeader(
            broker_name=self.config.broker_name, broker_addr=self.broker_addr,
            cluster_name=self.config.cluster_name, ha_server_addr=self.ha_addr,
            broker_id=broker_id, compressed=self.compressed, body_crc32=body_crc32(data))
        ext = header.to_ext()
        answers = await asyncio.gather(*(self._register(addr, ext, data)
                                         for addr in self.namesrv_addrs))
        self.registered_as = broker_id
        self.rounds += 1
        if self.on_master is not None:
            for answer in answers:
                if answer is not None and answer.master_addr:
                    self.on_master(answer.master_addr, answer.ha_server_addr or "")
                    break

    def _signed(self, cmd: RemotingCommand) -> tuple[RemotingCommand, str | None]:
        """``cmd`` in the envelope when a secret is set, and its nonce (None: unsigned)."""
        if self.config.cluster_secret is None:
            return cmd, None
        return cmd, sign_request(cmd, self.config.cluster_secret)

    def _untrusted(self, resp: RemotingCommand, nonce: str | None) -> str | None:
        """Why a signed answer is not believed (None: believed; unsigned: see the module)."""
        if nonce is None or not is_signed(resp.ext_fields):
            return None
        return check_answer(resp, self.config.cluster_secret, nonce)

    async def _register(self, addr: str, ext: dict[str, str],
                        body: bytes) -> RegisterBrokerResponseHeader | None:
        cmd, nonce = self._signed(RemotingCommand.request(RequestCode.REGISTER_BROKER, ext, body))
        try:
            resp = await asyncio.wait_for(self._clients[addr].invoke(cmd, REGISTER_TIMEOUT),
                                          REGISTER_TIMEOUT)
            why = self._untrusted(resp, nonce)
            if why is not None:
                raise ConnectionError(f"answered code {resp.code}, but not trusted: {why}")
            if resp.code != ResponseCode.SUCCESS:
                raise ConnectionError(f"answered code {resp.code}: {resp.remark}")
            answer = RegisterBrokerResponseHeader.from_ext(resp.ext_fields)
        except (OSError, TimeoutError, ConnectionError) as exc:
            if self.registered[addr] is not False:
                log.warning("cannot register with name server %s: %s (retrying every %g s)",
                            addr, link_failure(exc), self.config.register_interval)
            self.registered[addr] = False
            return None
        if self.registered[addr] is not True:
            log.info("registered with name server %s as %s id %d", addr,
                     self.config.broker_name, int(ext["brokerId"]))
        self.registered[addr] = True
        return answer

    async def _unregister(self, client: RemotingClient, header: UnRegisterBrokerRequestHeader) -> None:
        cmd, _ = self._signed(RemotingCommand.request(RequestCode.UNREGISTER_BROKER,
                                                      header.to_ext()))
        try:
            await asyncio.wait_for(client.invoke(cmd, UNREGISTER_TIMEOUT), UNREGISTER_TIMEOUT)
        except (OSError, TimeoutError, ConnectionError) as exc:
            log.warning("cannot unregister from name server %s: %s", client.addr,
                        exc or type(exc).__name__)
