"""The consumer's pulling: one long-poll PULL_MESSAGE outstanding per owned queue.

The suspend flag makes the broker hold a pull until a message arrives or
``long_poll_timeout`` passes, so an idle queue costs one request per long-poll period and a
new message is delivered at once.  What a pull brings is filtered by the tag string (the
broker filters by tag hash, and hashes collide) and put in the consumer's bounded buffer; a
full buffer stops the puller (back-pressure).  Each pull also carries the queue's committable
offset (the commit-offset flag), so a busy queue commits without a separate request.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

from txbroker.client.errors import ClientError
from txbroker.client.instance import ClientInstance
from txbroker.client.pulled import decode_pulled
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
    addr: str
    tracker: OffsetTracker
    task: asyncio.Task | None = None


class Puller:
    """Pulls owned queues into ``buffer`` as ``(tracker, PulledMessage)`` items."""

    def __init__(self, instance: ClientInstance, group: str, buffer: asyncio.Queue, *,
                 batch_size: int, long_poll_timeout: float, request_timeout: float,
                 error_backoff: float) -> None:
        self._instance = instance
        self.group = group
        self.buffer = buffer
        self.batch_size = batch_size
        self.long_poll_timeout = long_poll_timeout
        self.request_timeout = request_timeout
        self.error_backoff = error_backoff

    async def run(self, owned: OwnedQueue, sub: Subscription) -> None:
        """Pull ``owned`` until its tracker is dropped (the queue was given away)."""
        mq, tracker = owned.mq, owned.tracker
        while not tracker.dropped:
            commit = tracker.committable()
            sys_flag = PULL_FLAG_SUSPEND | PULL_FLAG_SUBSCRIPTION
            if commit > tracker.committed >= -1 and commit > 0:
                sys_flag |= PULL_FLAG_COMMIT_OFFSET
            cmd = RemotingCommand.request(RequestCode.PULL_MESSAGE, PullMessageRequestHeader(
                consumer_group=self.group, topic=mq.topic, queue_id=mq.queue_id,
                queue_offset=tracker.next_pull, max_msg_nums=self.batch_size,
                sys_flag=sys_flag, commit_offset=commit if sys_flag & PULL_FLAG_COMMIT_OFFSET else -1,
                suspend_timeout_millis=int(self.long_poll_timeout * 1000),
                subscription=sub.selected.sub_string, sub_version=sub.version,
                expression_type="TAG").to_ext())
            try:
                resp = await self._instance.invoke(owned.addr, cmd,
                                                   self.long_poll_timeout + self.request_timeout)
            except asyncio.CancelledError:
                raise
            except (OSError, ConnectionError, TimeoutError, ClientError) as exc:
                log.warning("consumer %s: pull %s failed: %s", self._instance.client_id, mq,
                            exc or type(exc).__name__)
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
            next_begin = PullMessageResponseHeader.from_ext(resp.ext_fields).next_begin_offset
        except HeaderError:  # an error answer carries no offsets
            next_begin = tracker.next_pull
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
            buffer = self.buffer
            for m in wanted:
                if buffer.full():
                    await buffer.put((tracker, m))  # back-pressure: waits while full
                else:
                    buffer.put_nowait((tracker, m))
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
        return False
