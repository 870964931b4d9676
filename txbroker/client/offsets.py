"""The consumer group's offsets on the brokers: where a newly owned queue starts, and commits.

A queue starts at the group's committed offset.  A group that never committed starts where
``from_where`` says: ``"last"`` (only messages sent from now on), ``"first"`` (everything
retained) or a timestamp in ms.  A RocketMQ broker answers 0, not "not found", for a group
that never committed while the queue still starts at 0, so a 0 is only believed when
txbroker's status document shows the commit (a broker without it is taken at its word, as
RocketMQ clients do).  Commits send the queue's committable offset (the smallest not yet
done, ``rebalance.OffsetTracker``), so a crash re-delivers and never skips.

Offsets belong to the broker group that owns the queue.  They are committed and queried on
the group's master; when it cannot be reached (down, or no master listed) the next address
of the group is tried, a slave, as RocketMQ's ``RemoteBrokerOffsetStore`` does, so a
consumer keeps its place while a group fails over.
"""

from __future__ import annotations

import logging
from datetime import datetime

import orjson

from txbroker.client.errors import BrokerError, ClientError
from txbroker.client.instance import ClientInstance
from txbroker.client.rebalance import MessageQueue, OffsetTracker
from txbroker.remoting.bodies import ConsumeFromWhere
from txbroker.remoting.codes import RequestCode, ResponseCode
from txbroker.remoting.command import RemotingCommand
from txbroker.remoting.headers import (
    GetMaxOffsetRequestHeader,
    GetMinOffsetRequestHeader,
    Header,
    HeaderError,
    OffsetResponseHeader,
    QueryConsumerOffsetRequestHeader,
    SearchOffsetRequestHeader,
    UpdateConsumerOffsetRequestHeader,
)

log = logging.getLogger(__name__)

#: ``from_where`` words and what a heartbeat announces for them.
FROM_WHERE = {"last": ConsumeFromWhere.CONSUME_FROM_LAST_OFFSET,
              "first": ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET}


def normalise_from_where(value: object) -> str | int:
    """Normalise ``from_where`` to "last", "first" or a timestamp in ms."""
    if isinstance(value, str) and value in FROM_WHERE:
        return value
    if isinstance(value, datetime):
        return int(value.timestamp() * 1000)
    if isinstance(value, (int, float)) and not isinstance(value, bool) and value >= 0:
        return int(value * 1000)
    raise ValueError(f"from_where must be 'last', 'first', a datetime or Unix seconds, got {value!r}")


class GroupOffsets:
    """Offset requests of one consumer group (``start`` is a normalised ``from_where``)."""

    def __init__(self, instance: ClientInstance, group: str, start: str | int) -> None:
        self._instance = instance
        self.group = group
        self.from_where = start

    async def _on_group(self, broker_name: str, call):
        """``await call(addr)`` on the group's offset addresses in turn (master first) until
        one is reachable; the last connection error propagates."""
        addrs = self._instance.namesrv.offset_addrs(broker_name)
        for i, addr in enumerate(addrs):
            try:
                return await call(addr)
            except (OSError, ConnectionError) as exc:
                if i == len(addrs) - 1:
                    raise
                log.info("offsets of %s: %s unreachable (%s); trying %s", broker_name, addr,
                         exc or type(exc).__name__, addrs[i + 1])
        raise AssertionError("offset_addrs is never empty")

    async def _request(self, code: int, addr: str, header: Header) -> int | None:
        """The ``offset`` a broker answers, None for QUERY_NOT_FOUND."""
        resp = await self._instance.invoke(addr, RemotingCommand.request(code, header.to_ext()))
        if resp.code == ResponseCode.QUERY_NOT_FOUND:
            return None
        if resp.code != ResponseCode.SUCCESS:
            raise BrokerError(f"offset request {code}", resp.code, resp.remark, addr)
        try:
            return OffsetResponseHeader.from_ext(resp.ext_fields).offset
        except HeaderError as exc:
            raise ClientError(f"offset request {code} to {addr}: {exc.remark}") from None

    async def start_offset(self, mq: MessageQueue, status_cache: dict) -> int:
        """Where this member starts pulling ``mq`` (``status_cache``: one rebalance's
        status documents by broker address), asked of the group's master, else a slave."""
        return await self._on_group(mq.broker_name,
                                    lambda addr: self._start_offset(mq, addr, status_cache))

    async def _start_offset(self, mq: MessageQueue, addr: str, status_cache: dict) -> int:
        topic, queue_id = mq.topic, mq.queue_id
        offset = await self._request(RequestCode.QUERY_CONSUMER_OFFSET, addr,
                                     QueryConsumerOffsetRequestHeader(
                                         consumer_group=self.group, topic=topic,
                                         queue_id=queue_id))
        # A RocketMQ broker also answers 0 for a group that never committed (while the
        # queue still starts at 0); only then does ``from_where`` apply.
        if offset is not None and (offset > 0 or self.from_where == "first"
                                   or await self._committed(addr, mq, status_cache)):
            return offset
        header: Header
        if self.from_where == "first":
            code, header = RequestCode.GET_MIN_OFFSET, GetMinOffsetRequestHeader(topic=topic, queue_id=queue_id)
        elif self.from_where == "last":
            code, header = RequestCode.GET_MAX_OFFSET, GetMaxOffsetRequestHeader(topic=topic, queue_id=queue_id)
        else:
            code, header = RequestCode.SEARCH_OFFSET_BY_TIMESTAMP, SearchOffsetRequestHeader(
                topic=topic, queue_id=queue_id, timestamp=int(self.from_where))
        return await self._request(code, addr, header) or 0

    async def _committed(self, addr: str, mq: MessageQueue, cache: dict) -> bool:
        """Whether the group really committed an offset for ``mq`` (txbroker's status
        document tells; a broker without it is taken at its word, as RocketMQ clients do)."""
        if addr not in cache:
            cache[addr] = None
            try:
                resp = await self._instance.invoke(addr, RemotingCommand.request(RequestCode.BROKER_STATUS))
                if resp.code == ResponseCode.SUCCESS:
                    cache[addr] = orjson.loads(resp.body)
            except (orjson.JSONDecodeError, ClientError, OSError, TimeoutError) as exc:
                log.debug("status from %s unavailable: %s", addr, exc)
        doc = cache[addr]
        if not isinstance(doc, dict):
            return True
        offsets = ((doc.get("consumerGroups") or {}).get(self.group) or {}).get("offsets") or {}
        return str(mq.queue_id) in (offsets.get(mq.topic) or {})

    async def commit(self, mq: MessageQueue, tracker: OffsetTracker, *, oneway: bool) -> None:
        """Commit ``tracker``'s committable offset of ``mq`` unless the broker has it already,
        to the group's master, else a slave."""
        offset = tracker.committable()
        if offset == tracker.committed:
            return
        await self._on_group(mq.broker_name, lambda addr: self._commit(mq, addr, offset, oneway))
        tracker.committed = offset

    async def _commit(self, mq: MessageQueue, addr: str, offset: int, oneway: bool) -> None:
        cmd = RemotingCommand.request(RequestCode.UPDATE_CONSUMER_OFFSET, UpdateConsumerOffsetRequestHeader(
            consumer_group=self.group, topic=mq.topic, queue_id=mq.queue_id,
            commit_offset=offset).to_ext(), oneway=oneway)
        if oneway:
            await self._instance.invoke_oneway(addr, cmd)
        else:
            resp = await self._instance.invoke(addr, cmd)
            if resp.code != ResponseCode.SUCCESS:
                raise BrokerError(f"commit offset of {mq}", resp.code, resp.remark, addr)
