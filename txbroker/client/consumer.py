"""The consumer: clustering consumption with long polling, rebalancing and at-least-once offsets.

Mirrors RocketMQ's push consumer, delivered through an async iterator instead of a callback:

* **Membership and allocation.**  The consumer heartbeats its subscriptions, asks a broker for
  the group's members (GET_CONSUMER_LIST_BY_GROUP) and takes its share of the topic's queues
  with the average strategy.  It re-balances when the broker announces a membership change
  (NOTIFY_CONSUMER_IDS_CHANGED) and every ``rebalance_interval`` in case a notice was lost.
* **Pulling** (``pull.py``).  One PULL_MESSAGE is outstanding per owned queue, with the suspend
  flag: the broker holds it until a message arrives or ``long_poll_timeout`` passes, so an
  idle consumer costs one request per queue per long-poll period, and a new message is
  delivered at once.  Pulled messages wait in a bounded buffer; a full buffer stops the pullers
  (back-pressure).
* **Offsets** (``offsets.py``).  A message is done when the caller asks for the next one (or, at
  a normal shutdown, when the consumer stops).  Each queue commits the smallest offset not yet
  done, so a crash re-delivers what was in flight and never skips it (at-least-once).  Offsets
  are committed every ``persist_interval``, on every pull (the commit-offset flag), when a
  queue is given away, and at shutdown.
* **Topics must exist.**  ``start()`` raises :class:`TopicNotFoundError` (naming the topic and
  the name server) for a subscribed topic the name server does not know; consuming never
  creates a topic.  A topic subscribed later, or deleted while consumed, is looked up again at
  every rebalance, with a warning, as RocketMQ's consumers do.
* **Where a new group starts.**  ``from_where="last"`` (only messages sent from now on),
  ``"first"`` (everything retained), or a timestamp (``datetime`` or Unix seconds).  A group's
  committed offset always wins.

Tag expressions are ``"*"`` or ``"TagA || TagB"``; the broker filters by tag hash and the
consumer re-checks the tag string, because hashes collide.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
import time
from collections.abc import Callable, Coroutine
from typing import Any, Self

from txbroker.client.delivery import DeliveryBuffer
from txbroker.client.errors import (
    BrokerError,
    ClientError,
    ClientStateError,
    TopicNotFoundError,
)
from txbroker.client.instance import DEFAULT_NAMESRV, ClientInstance
from txbroker.client.message import MessageExt, check_text, validate_topic
from txbroker.client.offsets import FROM_WHERE, GroupOffsets, normalise_from_where
from txbroker.client.producer import validate_group
from txbroker.client.pull import OwnedQueue, Puller, Subscription
from txbroker.client.reachability import is_connection_loss
from txbroker.client.rebalance import MessageQueue, OffsetTracker, allocate_average
from txbroker.remoting.bodies import (
    BodyError,
    ConsumeFromWhere,
    ConsumerData,
    ConsumerListBody,
)
from txbroker.remoting.codes import RequestCode, ResponseCode
from txbroker.remoting.command import RemotingCommand
from txbroker.remoting.filter import SubscriptionParseError, parse_tag_expression
from txbroker.remoting.headers import (
    GetConsumerListByGroupRequestHeader,
    HeaderError,
    NotifyConsumerIdsChangedRequestHeader,
)
from txbroker.remoting.tls import ClientTLS

log = logging.getLogger(__name__)

#: Refusals that stand until an operator acts (grants the right, creates the topic).
_LASTING_REFUSALS = frozenset({ResponseCode.NO_PERMISSION, ResponseCode.TOPIC_NOT_EXIST})


def is_lasting_refusal(exc: BrokerError) -> bool:
    """Whether retrying cannot help until an operator acts: NO_PERMISSION, TOPIC_NOT_EXIST, or
    an access-control denial, which the broker answers as RocketMQ's ACL hook does
    (SYSTEM_ERROR with an ``AclException`` remark)."""
    return exc.code in _LASTING_REFUSALS or (exc.code == ResponseCode.SYSTEM_ERROR
                                             and exc.remark.startswith("AclException"))


def _level(exc: BaseException) -> int:
    """DEBUG for a lost broker connection, which the client instance reports once per outage
    (``reachability.py``); WARNING for any other failure."""
    return logging.DEBUG if is_connection_loss(exc) else logging.WARNING


class Consumer:
    """``consumer.subscribe("T"); async with consumer: async for msg in consumer: ...``

    ``access_key``/``secret_key`` (RocketMQ's SessionCredentials) sign every request, for
    brokers that run access control; leave them unset otherwise.
    ``tls`` (a :class:`~txbroker.remoting.tls.ClientTLS` or an ``ssl.SSLContext``) makes every
    connection TLS, verifying the broker's certificate and host name (docs/security.md "TLS").
    """

    def __init__(self, group: str, namesrv: str = DEFAULT_NAMESRV, from_where: object = "last", *,
                 pull_batch_size: int = 32, long_poll_timeout: float = 15.0,
                 rebalance_interval: float = 20.0, persist_interval: float = 5.0,
                 buffer_size: int = 1024, request_timeout: float = 3.0,
                 heartbeat_interval: float = 30.0, pull_error_backoff: float = 1.0,
                 instance_name: str | None = None, access_key: str | None = None,
                 secret_key: str | None = None,
                 tls: ClientTLS | ssl.SSLContext | None = None) -> None:
        self.group = validate_group(group, "consumer group")
        self.from_where = normalise_from_where(from_where)
        if not 1 <= pull_batch_size <= 1024:
            raise ValueError("pull_batch_size must be in [1, 1024]")
        for name, v in (("long_poll_timeout", long_poll_timeout), ("rebalance_interval", rebalance_interval),
                        ("persist_interval", persist_interval), ("pull_error_backoff", pull_error_backoff)):
            if v <= 0:
                raise ValueError(f"{name} must be positive")
        if buffer_size < 1:
            raise ValueError("buffer_size must be at least 1")
        self.pull_batch_size = pull_batch_size
        self.long_poll_timeout = long_poll_timeout
        self.rebalance_interval = rebalance_interval
        self.persist_interval = persist_interval
        self.pull_error_backoff = pull_error_backoff
        self.request_timeout = request_timeout
        self._instance = ClientInstance(namesrv, request_timeout=request_timeout,
                                        heartbeat_interval=heartbeat_interval,
                                        instance_name=instance_name,
                                        access_key=access_key, secret_key=secret_key,
                                        tls=tls)
        self._instance.consumer_data[self.group] = self._consumer_data
        self._instance.on_request(RequestCode.NOTIFY_CONSUMER_IDS_CHANGED, self._on_ids_changed)
        self._offsets = GroupOffsets(self._instance, self.group, self.from_where)
        self._puller: Puller | None = None
        self._subs: dict[str, Subscription] = {}
        self._owned: dict[MessageQueue, OwnedQueue] = {}
        self._buffer: DeliveryBuffer | None = None
        self._buffer_size = buffer_size
        self._delivered: list[tuple[OffsetTracker, int]] = []
        #: Queues fixed by :meth:`assign` (None: the group's members share the queues).
        self._assigned: list[MessageQueue] | None = None
        self._rebalance_needed: asyncio.Event | None = None
        self._rebalance_lock: asyncio.Lock | None = None
        self._tasks: list[asyncio.Task] = []
        #: The last member-list request's lasting refusal (None once one is answered).
        self._group_refusal: BrokerError | None = None
        self._state = "new"

    @property
    def client_id(self) -> str:
        return self._instance.client_id

    def assignment(self) -> list[MessageQueue]:
        """The queues this consumer owns right now (sorted)."""
        return sorted(self._owned)

    # --- subscription --------------------------------------------------------------------
    def subscribe(self, topic: str, expression: str = "*") -> None:
        """Consume ``topic`` filtered by ``expression`` (``"*"`` or ``"A || B"``), read as
        RocketMQ's FilterAPI reads it (``remoting.filter``); ValueError if it has no part."""
        validate_topic(topic)
        try:
            selected = parse_tag_expression(expression)
        except SubscriptionParseError as exc:
            raise ValueError(exc.remark) from None
        for tag in selected.tags:
            check_text("tag", tag)
        self._subs[topic] = Subscription(topic, selected, int(time.time() * 1000))
        if self._state == "running":
            asyncio.get_running_loop().create_task(self._instance.heartbeat_all())
            assert self._rebalance_needed is not None
            self._rebalance_needed.set()

    def assign(self, queues: list[MessageQueue]) -> None:
        """Pull exactly ``queues`` (RocketMQ's ``LitePullConsumer.assign``): no share of the
        group is computed, so several members of one group may each own fixed, disjoint queues
        and still commit their offsets for the group (a restarted member resumes where the
        last one stopped).  Call before :meth:`start` (or while running, to change the set);
        each queue's topic is subscribed with ``*`` unless already subscribed."""
        queues = sorted(set(queues))
        if not queues:
            raise ValueError("assign() needs at least one queue")
        for mq in queues:
            if mq.topic not in self._subs:
                self.subscribe(mq.topic, "*")
        self._assigned = queues
        if self._state == "running":
            assert self._rebalance_needed is not None
            self._rebalance_needed.set()

    async def queues(self, topic: str) -> list[MessageQueue]:
        """The readable queues of ``topic`` (sorted), from the name server, for :meth:`assign`."""
        route = await self._instance.namesrv.route(topic, refresh=True)
        return sorted(route.read_queues())

    def _consumer_data(self) -> ConsumerData:
        where = self.from_where
        return ConsumerData(
            group_name=self.group,
            consume_from_where=FROM_WHERE[where] if isinstance(where, str)
            else ConsumeFromWhere.CONSUME_FROM_TIMESTAMP,
            subscription_data_set=[s.to_wire() for _, s in sorted(self._subs.items())])

    # --- lifecycle -----------------------------------------------------------------------
    async def start(self) -> None:
        if self._state != "new":
            raise ClientStateError(f"consumer {self.group} cannot start: it is {self._state}")
        if not self._subs:
            raise ClientStateError(f"consumer {self.group}: subscribe() to a topic before start()")
        self._state = "starting"
        self._buffer = DeliveryBuffer(self._buffer_size)
        self._puller = Puller(self._instance, self.group, self._buffer,
                              batch_size=self.pull_batch_size,
                              long_poll_timeout=self.long_poll_timeout,
                              request_timeout=self.request_timeout,
                              error_backoff=self.pull_error_backoff)
        self._rebalance_needed = asyncio.Event()
        self._rebalance_lock = asyncio.Lock()
        try:
            # Routes first: a subscription to a topic that does not exist fails here, before
            # the heartbeat registers the group (which would create its retry topic).
            for topic in self._subs:
                await self._instance.namesrv.route(topic)
            await self._instance.start()
            await self._instance.heartbeat_all()
            await self.rebalance()
        except BaseException:
            self._state = "new"  # start() may be called again (the topic may be created later)
            await self._stop_pullers()
            self._owned.clear()
            await self._instance.abort_start()
            raise
        self._state = "running"
        self._tasks = [
            asyncio.create_task(self._rebalance_loop(), name=f"txbroker-rebalance-{self.client_id}"),
            asyncio.create_task(self._persist_loop(), name=f"txbroker-offsets-{self.client_id}"),
        ]

    async def shutdown(self, *, ack_delivered: bool = True) -> None:
        """Stop pulling, commit offsets, leave the group.

        ``ack_delivered`` counts the message(s) last handed out as done; ``async with`` passes
        False when the block exits with an exception, so that message is delivered again.
        """
        if self._state in ("closed", "new"):
            if self._state == "new":
                await self._instance.abort_start()  # queues() may have opened the name server's
            self._state = "closed"
            return
        self._state = "closed"
        for task in self._tasks:
            task.cancel()
        # gather, not "suppress(CancelledError)": a cancellation of *this* task must propagate.
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self._stop_pullers()
        if ack_delivered:
            self._ack_delivered()
        self._delivered.clear()
        await self._commit_all(oneway=False)
        self._owned.clear()
        if self._buffer is not None:
            self._buffer.close()  # wakes anyone waiting in poll() / async for
        await self._instance.shutdown()

    async def _stop_pullers(self) -> None:
        tasks = [o.task for o in self._owned.values() if o.task is not None]
        for o in self._owned.values():
            o.tracker.dropped = True
        for t in tasks:
            t.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(self, exc_type, exc, tb) -> None:
        await self.shutdown(ack_delivered=exc_type is None)

    # --- delivery ------------------------------------------------------------------------
    def __aiter__(self) -> Self:
        return self

    async def __anext__(self) -> MessageExt:
        msg = await self._next(None)
        if msg is None:
            raise StopAsyncIteration
        return msg

    def poll(self, timeout: float | None = None) -> Coroutine[Any, Any, MessageExt | None]:
        """The next message, or None after ``timeout`` seconds (None = wait) or at shutdown.

        Await the result, as of a coroutine function: it is :meth:`_next` itself, so a
        delivered message costs no coroutine of its own on top.
        """
        return self._next(timeout)

    def refusal(self) -> BrokerError | None:
        """The broker's refusal if every owned queue's last pull was refused for a reason a
        retry does not change (:func:`is_lasting_refusal`), or, owning no queue, the group's
        member list was last refused so; None otherwise.

        The consumer keeps retrying, as RocketMQ's does (an operator may grant the right or
        create the topic); a caller that would rather fail asks this while it waits.
        """
        if not self._owned:
            return self._group_refusal
        refusals = [o.refusal for o in self._owned.values()]
        if any(r is None or not is_lasting_refusal(r) for r in refusals):
            return None
        return refusals[0]

    def defer_ack(self) -> Callable[[], None]:
        """Take the message last handed out off automatic acknowledgement; return its ack.

        Normally a message is done when the next one is asked for.  After ``defer_ack()`` it is
        done only once the returned function is called: until then its queue's committed
        offset stays before it, and a consumer that stops (or crashes) first leaves it to be
        delivered again.  ``txbroker consume`` acknowledges a line only once the reader of
        its output pipe has taken it.
        """
        held = list(self._delivered)
        self._delivered.clear()

        def ack() -> None:
            for tracker, offset in held:
                tracker.ack(offset)
        return ack

    def _ack_delivered(self) -> None:
        for tracker, offset in self._delivered:
            tracker.ack(offset)
        self._delivered.clear()

    async def _next(self, timeout: float | None) -> MessageExt | None:
        if self._state == "new":
            raise ClientStateError(f"consumer {self.group} is not started")
        delivered = self._delivered
        if delivered:  # _ack_delivered inline: this runs once per delivered message
            for tracker, offset in delivered:
                tracker.ack(offset)
            delivered.clear()
        buffer = self._buffer
        if buffer is None or (self._state == "closed" and not buffer.items):
            return None
        items = buffer.items
        deadline = None
        while True:
            if items:  # a backlog is delivered without a timer or a wait
                tracker, msg = buffer.get_nowait()
            else:
                loop = asyncio.get_running_loop()
                if deadline is None and timeout is not None:
                    deadline = loop.time() + timeout
                remaining = None if deadline is None else max(deadline - loop.time(), 0.0)
                try:
                    # asyncio.timeout, not wait_for: on Python 3.11 wait_for can swallow a
                    # cancellation that races with the item arriving.
                    async with asyncio.timeout(remaining):
                        item = await buffer.get()
                except TimeoutError:
                    return None
                if item is None:  # closed: the consumer shut down
                    return None
                tracker, msg = item
            if tracker.dropped:
                continue  # its queue moved to another member, which re-delivers from the offset
            delivered.append((tracker, msg.queue_offset))
            return msg

    # --- rebalance -----------------------------------------------------------------------
    def _on_ids_changed(self, addr: str, cmd: RemotingCommand) -> None:
        try:
            group = NotifyConsumerIdsChangedRequestHeader.from_ext(cmd.ext_fields).consumer_group
        except HeaderError:
            group = self.group  # a notice that names no group: rebalance anyway
        if group == self.group and self._rebalance_needed:
            log.info("consumer %s: group membership changed (notified by %s)", self.client_id, addr)
            self._rebalance_needed.set()

    async def _rebalance_loop(self) -> None:
        assert self._rebalance_needed is not None
        while self._state != "closed":
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.rebalance_interval):
                    await self._rebalance_needed.wait()
            self._rebalance_needed.clear()
            try:
                await self.rebalance()
            except asyncio.CancelledError:
                raise
            except (ClientError, OSError, TimeoutError) as exc:
                log.log(_level(exc), "consumer %s: rebalance failed: %s", self.client_id, exc)

    async def _members(self, addr: str) -> list[str]:
        cmd = RemotingCommand.request(RequestCode.GET_CONSUMER_LIST_BY_GROUP,
                                      GetConsumerListByGroupRequestHeader(consumer_group=self.group).to_ext())
        resp = await self._instance.invoke(addr, cmd)
        if resp.code != ResponseCode.SUCCESS:
            return []  # "no consumer for this group": our heartbeat has not landed yet
        try:
            return ConsumerListBody.decode(resp.body).consumer_id_list
        except BodyError as exc:
            raise ClientError(f"consumer list from {addr}: {exc.remark}") from None

    async def rebalance(self) -> None:
        """Recompute this member's queues now and start/stop pulling accordingly."""
        assert self._rebalance_lock is not None
        async with self._rebalance_lock:
            status_cache: dict = {}
            if self._assigned is not None:
                await self._own_exactly(set(self._assigned), status_cache)
                return
            for topic, _sub in list(self._subs.items()):
                try:
                    route = await self._instance.namesrv.route(topic, refresh=True)
                except TopicNotFoundError as exc:
                    # Deleted meanwhile, or subscribed while running: keep what is owned and
                    # look again at the next rebalance, as RocketMQ's consumers do.
                    log.warning("consumer %s: %s; retrying every %.0f s", self.client_id, exc,
                                self.rebalance_interval)
                    continue
                queues = route.read_queues()
                members: set[str] = set()
                unreachable = False
                for name in sorted({q.broker_name for q in queues}):
                    # Any group's master (else slave) knows the members; one unreachable
                    # group must not stop the rebalance over the others.
                    try:
                        members.update(await self._members(self._instance.namesrv.read_addr(name)))
                        self._group_refusal = None
                    except (ClientError, OSError, TimeoutError) as exc:
                        if isinstance(exc, BrokerError) and is_lasting_refusal(exc):
                            self._group_refusal = exc
                        unreachable = unreachable or is_connection_loss(exc)
                        log.log(_level(exc), "consumer %s: member list from %s unavailable: %s",
                                self.client_id, name, exc or type(exc).__name__)
                if not members and queues:
                    # No member list (our heartbeat has not landed, or the broker restarted):
                    # keep the current queues rather than dropping everything (RocketMQ too).
                    log.log(logging.DEBUG if unreachable else logging.WARNING,
                            "consumer %s: no member list for group %s; keeping %d queue(s)",
                            self.client_id, self.group, len(self._owned))
                    continue
                mine = set(allocate_average(queues, sorted(members), self.client_id))
                current = {mq for mq in self._owned if mq.topic == topic}
                for mq in sorted(current - mine):
                    await self._release(mq)
                for mq in sorted(mine - current):
                    await self._acquire(mq, status_cache)
                if current != mine:
                    log.info("consumer %s: %s queues now %s", self.client_id, topic,
                             [q.queue_id for q in sorted(mine)])
            for mq in [mq for mq in self._owned if mq.topic not in self._subs]:
                await self._release(mq)

    async def _own_exactly(self, wanted: set[MessageQueue], status_cache: dict) -> None:
        """Assigned mode: release what is not ``wanted`` and pull what is not yet owned."""
        for mq in sorted(set(self._owned) - wanted):
            await self._release(mq)
        for mq in sorted(wanted - set(self._owned)):
            await self._acquire(mq, status_cache)

    async def _release(self, mq: MessageQueue) -> None:
        owned = self._owned.pop(mq)
        owned.tracker.dropped = True
        if owned.task is not None:
            owned.task.cancel()
            await asyncio.gather(owned.task, return_exceptions=True)
        # Hand over exactly where this member stopped, so the next owner neither skips nor
        # needlessly repeats.
        try:
            await self._commit(owned, oneway=False)
        except (ClientError, OSError, TimeoutError) as exc:
            log.log(_level(exc), "consumer %s: offset of %s not committed on release: %s",
                    self.client_id, mq, exc)

    async def _acquire(self, mq: MessageQueue, status_cache: dict) -> None:
        offset = await self._offsets.start_offset(mq, status_cache)
        owned = OwnedQueue(mq, self._instance.namesrv.read_addr(mq.broker_name), OffsetTracker(offset))
        self._owned[mq] = owned
        assert self._puller is not None
        owned.task = asyncio.get_running_loop().create_task(
            self._puller.run(owned, self._subs[mq.topic]), name=f"txbroker-pull-{mq}")

    # --- offsets -------------------------------------------------------------------------
    async def _commit(self, owned: OwnedQueue, *, oneway: bool) -> None:
        await self._offsets.commit(owned.mq, owned.tracker, oneway=oneway)

    async def _commit_all(self, *, oneway: bool) -> None:
        for owned in list(self._owned.values()):
            try:
                await self._commit(owned, oneway=oneway)
            except (ClientError, OSError, TimeoutError) as exc:
                log.log(_level(exc), "consumer %s: offset of %s not committed: %s",
                        self.client_id, owned.mq, exc)

    async def _persist_loop(self) -> None:
        while True:
            await asyncio.sleep(self.persist_interval)
            await self._commit_all(oneway=True)
