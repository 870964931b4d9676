"""The consumer's pulling: one long-poll PULL_MESSAGE outstanding per owned queue.

The suspend flag makes the broker hold a pull until a message arrives or
``long_poll_timeout`` passes, so an idle queue costs one request per long-poll period and a
new message is delivered at once.  What a pull brings is filtered by the tag string (the
broker filters by tag hash, and hashes collide) and put in the consumer's bounded buffer; a
full buffer stops the puller (back-pressure).  Each pull to a master also carries the queue's
committable offset (the commit-offset flag), so a busy queue commits without a separate request.

Where a queue is pulled from follows RocketMQ's ``PullAPIWrapper``: each queue keeps a "pull
from" broker id, 0 (the master) at first and then whatever the last answer's
``suggestWhichBrokerId`` says; the address is that id's if the group lists it, else the
master's, else the lowest slave's (a group whose master is down is read from a slave).  A
connection to an address that fails makes the puller refresh the route and pass that address
over for ``AVOID_FAILED_FOR`` seconds, so a dead master the name server still lists does not
stop the queue while a slave can serve it.  A lost connection is logged once per outage by
the client instance, not once per queue and retry.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

from txbroker.client.delivery import DeliveryBuffer
from txbroker.client.errors import BrokerError, ClientError
from txbroker.client.frames import FrameTemplate
from txbroker.client.instance import ClientInstance
from txbroker.client.pulled import decode_pulled
from txbroker.client.reachability import is_connection_loss
from txbroker.client.rebalance import MessageQueue, OffsetTracker
from txbroker.remoting.bodies import SubscriptionData
from txbroker.remoting.codes import RequestCode, ResponseCode
from txbroker.remoting.command import RemotingCommand
from txbroker.remoting.filter import TagExpression
from txbroker.remoting.headers import (
    PULL_FLAG_COMMIT_OFFSET,
    PULL_FLAG_SUBSCRIPTION,
    PULL_FLAG_SUSPEND,
    HeaderError,
    PullMessageRequestHeader,
    PullMessageResponseHeader,
)
from txbroker.store import record as rec

log = logging.getLogger(__name__)

#: Seconds a pull address whose connection failed is passed over (when the group lists another).
AVOID_FAILED_FOR = 10.0
#: The fields of a queue's PULL that differ per pull.
PULL_HOLES = ("queueOffset", "sysFlag", "commitOffset")
#: PULL templates kept per consumer (one per owned queue and subscription version).
MAX_PULL_TEMPLATES = 1024


@dataclass
class Subscription:
    """A subscribed topic: its parsed tag expression and the version heartbeats announce."""

    topic: str
    selected: TagExpression
    version: int

    def to_wire(self) -> SubscriptionData:
        tags = sorted(self.selected.tags)
        return SubscriptionData(topic=self.topic, sub_string=self.selected.sub_string,
                                tags_set=tags, code_set=[rec.tag_hash(t) for t in tags],
                                sub_version=self.version)


@dataclass
class OwnedQueue:
    """A queue this member owns: where it lives, its offsets and the task pulling it."""

    mq: MessageQueue
    #: Address of the last pull (for messages).
    addr: str
    tracker: OffsetTracker
    task: asyncio.Task | None = None
    #: Broker id to pull from next (the last ``suggestWhichBrokerId``; 0 = master).
    broker_id: int = 0
    #: The broker's refusal of the last pull (None once a pull is answered normally).
    refusal: BrokerError | None = None


class Puller:
    """Pulls owned queues into ``buffer`` as ``(tracker, PulledMessage)`` items."""

    def __init__(self, instance: ClientInstance, group: str, buffer: DeliveryBuffer, *,
                 batch_size: int, long_poll_timeout: float, request_timeout: float,
                 error_backoff: float) -> None:
        self._instance = instance
        self.group = group
        self.buffer = buffer
        self.batch_size = batch_size
        self.long_poll_timeout = long_poll_timeout
        self.request_timeout = request_timeout
        self.error_backoff = error_backoff
        #: Address -> loop time until which it is passed over (its connection failed).
        self.avoid: dict[str, float] = {}
        #: (queue, subscription, its version) -> the queue's PULL frame template.
        self._pull_frames: dict[tuple[MessageQueue, str, int], FrameTemplate] = {}

    def _pull_frame(self, mq: MessageQueue, sub: Subscription) -> FrameTemplate:
        """The PULL of ``mq`` for ``sub``'s current version, encoded but for the offsets and
        flags each pull fills in (``frames.py``)."""
        key = (mq, sub.selected.sub_string, sub.version)
        template = self._pull_frames.get(key)
        if template is None:
            if len(self._pull_frames) >= MAX_PULL_TEMPLATES:
                self._pull_frames.clear()
            template = self._pull_frames[key] = FrameTemplate(
                RequestCode.PULL_MESSAGE, PullMessageRequestHeader(
                    consumer_group=self.group, topic=mq.topic, queue_id=mq.queue_id,
                    queue_offset=0, max_msg_nums=self.batch_size, sys_flag=0, commit_offset=-1,
                    suspend_timeout_millis=int(self.long_poll_timeout * 1000),
                    subscription=sub.selected.sub_string, sub_version=sub.version,
                    expression_type="TAG").to_ext(), PULL_HOLES, ints=frozenset(PULL_HOLES))
        return template

    def pull_addr(self, owned: OwnedQueue) -> str:
        """Where to pull ``owned`` now (see the module docstring)."""
        if self.avoid:
            now = asyncio.get_running_loop().time()
            for addr in [a for a, until in self.avoid.items() if until <= now]:
                del self.avoid[addr]
        return self._instance.namesrv.read_addr(owned.mq.broker_name, owned.broker_id, self.avoid)

    async def _connection_failed(self, owned: OwnedQueue, addr: str) -> None:
        """Pass ``addr`` over for a while and look the route up again (a failover may have
        named a new master, or dropped the old one)."""
        self.avoid[addr] = asyncio.get_running_loop().time() + AVOID_FAILED_FOR
        owned.broker_id = 0
        try:
            await self._instance.namesrv.route(owned.mq.topic, refresh=True)
        except (ClientError, OSError, TimeoutError) as exc:
            log.debug("consumer %s: route of %s not refreshed: %s", self._instance.client_id,
                      owned.mq.topic, exc)

    async def run(self, owned: OwnedQueue, sub: Subscription) -> None:
        """Pull ``owned`` until its tracker is dropped (the queue was given away)."""
        mq, tracker = owned.mq, owned.tracker
        namesrv = self._instance.namesrv
        while not tracker.dropped:
            try:
                addr = owned.addr = self.pull_addr(owned)
            except ClientError as exc:  # the group left every route: wait for it to return
                log.warning("consumer %s: pull %s: %s", self._instance.client_id, mq, exc)
                await asyncio.sleep(self.error_backoff)
                continue
            commit = tracker.committable()
            sys_flag = PULL_FLAG_SUSPEND | PULL_FLAG_SUBSCRIPTION
            # A slave never stores a pull's commit offset: only a master gets the flag.
            if commit > tracker.committed >= -1 and commit > 0 and namesrv.is_master(mq.broker_name, addr):
                sys_flag |= PULL_FLAG_COMMIT_OFFSET
            cmd = self._pull_frame(mq, sub).fill((
                tracker.next_pull, sys_flag,
                commit if sys_flag & PULL_FLAG_COMMIT_OFFSET else -1))
            try:
                resp = await self._instance.invoke(addr, cmd,
                                                   self.long_poll_timeout + self.request_timeout)
            except asyncio.CancelledError:
                raise
            except (OSError, ConnectionError, TimeoutError, ClientError) as exc:
                lost = is_connection_loss(exc)
                # A lost connection is reported once per outage by the instance, not per retry.
                log.log(logging.DEBUG if lost else logging.WARNING,
                        "consumer %s: pull %s from %s failed: %s", self._instance.client_id,
                        mq, addr, exc or type(exc).__name__)
                if lost:
                    await self._connection_failed(owned, addr)
                await asyncio.sleep(self.error_backoff)
                continue
            if sys_flag & PULL_FLAG_COMMIT_OFFSET:
                tracker.committed = max(tracker.committed, commit)
            if not await self._handle(owned, sub, resp):
                await asyncio.sleep(self.error_backoff)

    async def _handle(self, owned: OwnedQueue, sub: Subscription, resp: RemotingCommand) -> bool:
        """Apply one pull answer; False when the puller should back off before the next."""
        mq, tracker = owned.mq, owned.tracker
        client_id = self._instance.client_id
        try:
            header = PullMessageResponseHeader.from_ext(resp.ext_fields)
        except HeaderError:  # an error answer carries no offsets
            next_begin = tracker.next_pull
        else:
            next_begin = header.next_begin_offset
            owned.broker_id = header.suggest_which_broker_id  # where the broker says to pull next
        owned.refusal = None
        if resp.code == ResponseCode.SUCCESS:
            try:
                msgs = decode_pulled(resp.body, mq.broker_name)
            except rec.RecordError as exc:
                log.error("consumer %s: undecodable pull body from %s for %s: %s",
                          client_id, owned.addr, mq, exc)
                return False
            first, selected = tracker.next_pull, sub.selected
            if selected.matches_all:  # "*": no tag to read, so no properties to decode
                wanted = [m for m in msgs if m.queue_offset >= first]
            else:
                wanted = [m for m in msgs if m.queue_offset >= first and selected.matches(m.tags)]
            tracker.pulled([m.queue_offset for m in wanted], next_begin)
            # The whole pull in one call; back-pressure: waits while the buffer is full.
            await self.buffer.put_all([(tracker, m) for m in wanted])
            return True
        if resp.code in (ResponseCode.PULL_NOT_FOUND, ResponseCode.PULL_RETRY_IMMEDIATELY):
            tracker.moved(next_begin)
            return True
        if resp.code == ResponseCode.PULL_OFFSET_MOVED:
            log.warning("consumer %s: offset %d of %s is no longer valid; moving to %d",
                        client_id, tracker.next_pull, mq, next_begin)
            tracker.reset(next_begin)
            return True
        log.warning("consumer %s: pull %s refused: %d %s", client_id, mq, resp.code,
                    resp.remark or "")
        owned.refusal = BrokerError(f"pull topic {mq.topic!r} queue {mq.queue_id} as group "
                                    f"{self.group!r}", resp.code, resp.remark, owned.addr)
        return False
