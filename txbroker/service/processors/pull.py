"""PULL_MESSAGE (11) with long polling.

A push consumer keeps one pull outstanding per queue, up to 8 on one connection, and expects
its other requests answered meanwhile (docs/protocol.md §8.5); the server runs each request in
its own task, so a held pull only costs a future here.  When the suspend flag is set and
nothing is there, the pull waits on :class:`PullHoldService` until the store reports a new
message for that queue (``store.add_listener``), or answers PULL_NOT_FOUND at
``min(suspendTimeoutMillis, max_pull_suspend)``.  A held pull whose connection closes is
released at once (the server's disconnect callback), unanswered: a consumer that left must not
show as held pulls for up to ``max_pull_suspend``.

Filtering uses the subscription string of the request when the subscription flag is set (what
a Java broker does, and the only reliable source: C++ heartbeats carry zero tag codes),
otherwise the group's subscription from its heartbeat; tags are compared by hash in the consume
queue, as RocketMQ does.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable

from txbroker.config import BrokerConfig
from txbroker.remoting.codes import RequestCode, ResponseCode
from txbroker.remoting.command import RemotingCommand
from txbroker.remoting.errors import Refusal
from txbroker.remoting.filter import parse_tag_expression
from txbroker.remoting.headers import PullMessageRequestHeader
from txbroker.service.clients import ClientRegistry
from txbroker.service.processors.statuses import GET_ANSWERS
from txbroker.service.topics import (
    PERM_READ,
    TopicManager,
    is_system_topic,
    validate_group_name,
)
from txbroker.store.record import tag_hash

log = logging.getLogger(__name__)

#: Upper bound on messages per pull, whatever the client asks (RocketMQ caps at 32 by default
#: in the client; a broker-side cap keeps one response bounded).
MAX_PULL_BATCH = 1024
#: Distinct subscription expressions whose parsed tag filter is kept (then the cache restarts).
MAX_CACHED_FILTERS = 1024


class PullHoldService:
    """Futures of held pulls per (topic, queue id), woken by the store's put listener.

    A held pull also belongs to its connection: when the consumer goes away (the server's
    disconnect callback, :meth:`connection_closed`), its holds are released at once instead
    of counting as held pulls until their deadline, up to ``max_pull_suspend`` later.
    """

    def __init__(self) -> None:
        self._waiters: dict[tuple[str, int], list[asyncio.Future]] = {}
        #: connection -> its held pulls (future -> (topic, queue id)); Kafka fetches name none.
        self._by_conn: dict[object, dict[asyncio.Future, tuple[str, int]]] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread: int | None = None
        self.closing = False

    def bind(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._loop_thread = threading.get_ident()

    def on_put(self, topic: str, queue_id: int, _max_offset: int) -> None:
        """Store listener: called for every dispatched message, so it must stay cheap."""
        key = (topic, queue_id)
        if key not in self._waiters:
            return
        if threading.get_ident() != self._loop_thread and self._loop is not None:
            self._loop.call_soon_threadsafe(self._wake, key)
        else:
            self._wake(key)

    def _wake(self, key: tuple[str, int]) -> None:
        waiters = self._waiters.pop(key, None)
        if waiters:
            for fut in waiters:
                if not fut.done():
                    fut.set_result(True)

    def wait(self, topic: str, queue_id: int, conn: object = None) -> asyncio.Future:
        """A future woken with True by a put to the queue, or False when it expires; with
        ``conn``, also False when that connection closes, and the holder calls
        :meth:`release` once the future is done."""
        fut = asyncio.get_running_loop().create_future()
        key = (topic, queue_id)
        self._waiters.setdefault(key, []).append(fut)
        if conn is not None:
            self._by_conn.setdefault(conn, {})[fut] = key
        return fut

    def discard(self, topic: str, queue_id: int, fut: asyncio.Future) -> None:
        """Forget a hold that no put woke (expired or released)."""
        waiters = self._waiters.get((topic, queue_id))
        if waiters and fut in waiters:
            waiters.remove(fut)
            if not waiters:
                del self._waiters[(topic, queue_id)]

    def release(self, fut: asyncio.Future, conn: object) -> None:
        """The hold ``fut`` of ``conn`` ended: it no longer belongs to the connection."""
        held = self._by_conn.get(conn)
        if held is not None:
            held.pop(fut, None)
            if not held:
                del self._by_conn[conn]

    def connection_closed(self, conn: object) -> None:
        """Server disconnect callback: release the connection's held pulls now.  Their
        handlers find the connection closed and end without reading or answering."""
        for fut, (topic, queue_id) in list(self._by_conn.pop(conn, {}).items()):
            self.discard(topic, queue_id, fut)
            if not fut.done():
                fut.set_result(False)

    def held(self) -> int:
        return sum(len(w) for w in self._waiters.values())

    def recheck(self) -> None:
        """Wake every held pull to look again (each is held again if it still finds nothing):
        a SYNC_MASTER calls it when a slave's acknowledgement makes more messages visible."""
        for key in list(self._waiters):
            self._wake(key)

    def wake_all(self) -> None:
        """Shutdown: answer every held pull now (PULL_NOT_FOUND) instead of at its deadline."""
        self.closing = True
        for key in list(self._waiters):
            self._wake(key)


class PullProcessor:
    def __init__(self, config: BrokerConfig, store, topics: TopicManager,
                 registry: ClientRegistry, holds: PullHoldService,
                 clock: Callable[[], float] | None = None) -> None:
        self.config = config
        self.store = store
        self.topics = topics
        self.registry = registry
        self.holds = holds
        self._filters: dict[str | None, frozenset[int] | None] = {}

    def handlers(self) -> dict[int, object]:
        return {RequestCode.PULL_MESSAGE: self.handle}

    async def handle(self, conn, cmd: RemotingCommand) -> RemotingCommand:
        """Answer with messages, or hold the pull; a refused pull raises :class:`Refusal`."""
        h = PullMessageRequestHeader.from_ext(cmd.ext_fields)
        group = validate_group_name(h.consumer_group, "consumer group")
        topic = h.topic
        queue_id = h.queue_id
        offset = h.queue_offset
        suspend_ms = h.suspend_timeout_millis
        expression_type = h.expression_type or "TAG"
        if expression_type.upper() != "TAG":
            raise Refusal(ResponseCode.SUBSCRIPTION_PARSE_FAILED,
                          f"expression type {expression_type!r} is not supported (TAG only)")
        if is_system_topic(topic):
            # Half, op, discarded and scheduled messages are broker state, not deliveries:
            # pulling them would expose undecided or rolled-back transactions.
            raise Refusal(ResponseCode.NO_PERMISSION,
                          f"topic[{topic}] is a system topic and cannot be pulled")
        tc = self.topics.get(topic)
        if tc is None:  # a pull never creates a topic, not even a retry topic
            raise Refusal(ResponseCode.TOPIC_NOT_EXIST, f"topic[{topic}] not exist, apply first please!")
        if not tc.perm & PERM_READ:
            raise Refusal(ResponseCode.NO_PERMISSION, f"topic[{topic}] is not readable")
        if queue_id >= tc.read_queue_nums:
            raise Refusal(ResponseCode.SYSTEM_ERROR,
                          f"queueId[{queue_id}] is illegal, topic {topic} has "
                          f"{tc.read_queue_nums} read queues")
        if h.has_subscription:
            tag_filter = self._tag_filter(h.subscription)
        else:
            sub = self.registry.subscription(group, topic)
            # Not SUB_ALL: only the listed tags' hashes, so a blank expression selects nothing.
            tag_filter = (None if sub is None or sub.matches_all
                          else {tag_hash(t) for t in sub.tags})
        if (h.commit_offset_enabled and h.commit_offset >= 0
                and self.store.offsets.get(group, topic, queue_id) != h.commit_offset):
            # Through the commitlog, not waited for (the pull's answer does not depend on it;
            # RocketMQ's commit flag is best effort too); a slave refuses to write it.  Only a
            # change is written: a consumer repeats its position on every pull.
            self.store.commit_offsets_now([(group, topic, queue_id, h.commit_offset, None)])
        max_nums = min(h.max_msg_nums, MAX_PULL_BATCH)

        resp = self._once(cmd, topic, queue_id, offset, max_nums, tag_filter)
        if resp.code != ResponseCode.PULL_NOT_FOUND or not h.suspend or suspend_ms <= 0:
            return resp
        loop = asyncio.get_running_loop()
        deadline = loop.time() + min(suspend_ms / 1000.0, self.config.max_pull_suspend)
        holds = self.holds
        while not holds.closing:
            remaining = deadline - loop.time()
            if remaining <= 0:
                break
            # The held future itself carries the time-out (result False), one timer handle:
            # asyncio.wait_for would add a future, a callback and a cancellation per hold.
            fut = holds.wait(topic, queue_id, conn)
            timer = loop.call_later(remaining, _expire, fut)
            try:
                woken = await fut
            finally:
                timer.cancel()
                holds.release(fut, conn)
            if conn.closed:
                return None  # the consumer has gone: nobody to read for or to answer
            if not woken:
                holds.discard(topic, queue_id, fut)
                break
            resp = self._once(cmd, topic, queue_id, offset, max_nums, tag_filter)
            if resp.code != ResponseCode.PULL_NOT_FOUND:
                return resp
        return self._once(cmd, topic, queue_id, offset, max_nums, tag_filter)

    def _once(self, cmd, topic, queue_id, offset, max_nums, tag_filter) -> RemotingCommand:
        res = self.store.get(topic, queue_id, offset, max_nums, tag_filter=tag_filter)
        code, remark = GET_ANSWERS[res.status]
        # PullMessageResponseHeader's extFields, built directly: this runs once per pull.
        resp = cmd.response(code, remark, ext={
            "suggestWhichBrokerId": "0", "nextBeginOffset": str(res.next_offset),
            "minOffset": str(res.min_offset), "maxOffset": str(res.max_offset)})
        if code == ResponseCode.SUCCESS and res.raw:
            resp.body_parts = res.raw  # the stored records go to the socket as they are
        return resp

    def _tag_filter(self, expression: str | None) -> frozenset[int] | None:
        """The tag hashes an expression selects (None: every tag), parsed once per distinct
        expression: a consumer sends the same one with every pull."""
        try:
            return self._filters[expression]
        except KeyError:
            pass
        selected = parse_tag_expression(expression)  # raises on a bad one: nothing cached
        # Not SUB_ALL: only the listed tags' hashes, so an expression of blanks selects nothing.
        hashes = None if selected.matches_all else frozenset(tag_hash(t) for t in selected.tags)
        if len(self._filters) >= MAX_CACHED_FILTERS:
            self._filters.clear()
        self._filters[expression] = hashes
        return hashes


def _expire(fut: asyncio.Future) -> None:
    """A held pull's time is up: wake it with False (unless the store woke it first)."""
    if not fut.done():
        fut.set_result(False)
