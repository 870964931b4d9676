"""POP consumption over gRPC: ReceiveMessage, AckMessage, ChangeInvisibleDuration,
ForwardMessageToDeadLetterQueue and QueryAssignment on the POP service
(txbroker/service/pop/, docs/grpc.md "POP consumption").

What the apache/rocketmq proxy does, and what its clients expect (``ReceiveMessageActivity``,
``ReceiveMessageResponseStreamWriter``, ``AckMessageActivity``, ``RouteActivity``):

* ReceiveMessage streams ``status`` OK, then one frame per message, then a
  ``delivery_timestamp`` frame; nothing within the long-polling time is a MESSAGE_NOT_FOUND
  status and the timestamp.  The long-polling time is the request's, else the call's time left
  less half the client's request timeout, within the limits below and the call's deadline.
  The queue of the request only names the broker: a receive pops any queue of the topic here,
  as the proxy's queue selector does.  A PushConsumer's receive (``auto_renew``) is renewed
  while the client is connected (its session lives), as the proxy renews it.  Unlike the proxy, a short long-polling time is not
  raised to 5 s: the client's time is honoured, up to 20 s (``pop_max_poll`` bounds it too).  FIFO comes from the group (``pop_fifo_groups``), as the
  settings the broker answered tell the client.  A message the stream could not write is made
  visible again at once instead of after its invisible time (the proxy's NACK).
* AckMessage answers each entry, and OK, the one code of all entries, or MULTIPLE_RESULTS.
* A refused receipt handle is INVALID_RECEIPT_HANDLE (clients stop retrying), an invisible
  time out of range ILLEGAL_INVISIBLE_TIME, a bad filter ILLEGAL_FILTER_EXPRESSION.
* QueryAssignment gives a non-FIFO group one queue with id -1 ("any queue of this broker") per
  broker group holding the topic, a FIFO group every readable queue, so each is popped by one
  consumer at a time.

A receive before the client's Telemetry settings works: nothing here needs them.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable

from txbroker.config import BrokerConfig
from txbroker.remoting.filter import parse_tag_expression
from txbroker.remoting.grpc import definition_pb2 as pb
from txbroker.remoting.grpc import service_pb2 as spb
from txbroker.remoting.header_codec import HeaderError
from txbroker.service.grpc.messages import duration_ms, timestamp
from txbroker.service.grpc.route import message_queues
from txbroker.service.grpc.status import Code, GrpcError, status
from txbroker.service.pop import PopError, PopErrorKind, Popped, PopService

log = logging.getLogger(__name__)

#: The proxy's longest long-polling time (``grpcClientConsumerMaxLongPollingTimeoutMillis``).
MAX_POLL_MS = 20_000
#: Kept back from the call's deadline: the stream still has its frames to write.
DEADLINE_MARGIN_MS = 500
#: A PushConsumer's receive (``auto_renew``): invisible for the proxy's renew slice, renewed
#: while the client is connected for up to the proxy's ``renewMaxTimeMillis``.
AUTO_RENEW_INVISIBLE_MS = 60_000
AUTO_RENEW_MAX_MS = 3 * 3600 * 1000
#: The proxy's request timeout when a client's settings name none.
DEFAULT_REQUEST_TIMEOUT_MS = 3_000

#: POP refusals as the 5.x codes clients react to.
_CODES = {
    PopErrorKind.BAD_REQUEST: Code.BAD_REQUEST,
    PopErrorKind.INVALID_HANDLE: Code.INVALID_RECEIPT_HANDLE,
    PopErrorKind.TOPIC_NOT_FOUND: Code.TOPIC_NOT_FOUND,
    PopErrorKind.TOO_MANY: Code.TOO_MANY_REQUESTS,
    PopErrorKind.NOT_SERVING: Code.HA_NOT_AVAILABLE,
    PopErrorKind.STORE_REFUSED: Code.INTERNAL_SERVER_ERROR,
}


def refused(exc: PopError) -> GrpcError:
    return GrpcError(_CODES[exc.kind], str(exc))


class ConsumeHandlers:
    """The consumer RPCs of the servicer (txbroker/service/grpc/server.py)."""

    def __init__(self, config: BrokerConfig, pop: PopService, topics, *, sessions,
                 broker_name: str, here: Callable[[], pb.Endpoints],
                 to_pb: Callable[..., pb.Message], client_id: Callable[..., str],
                 cluster=None) -> None:
        self.config = config
        self.pop = pop
        self.topics = topics
        self.sessions = sessions
        self.broker_name = broker_name
        self.here = here
        self.to_pb = to_pb
        self.client_id = client_id
        #: Routes across the cluster (txbroker/service/grpc/cluster.py), None on one broker.
        self.cluster = cluster
        self.fifo_groups = frozenset(g.strip() for g in config.pop_fifo_groups.split(",")
                                     if g.strip())

    def is_fifo_group(self, group: str) -> bool:
        return group in self.fifo_groups

    # --- ReceiveMessage -----------------------------------------------------------------------
    async def ReceiveMessage(self, request: spb.ReceiveMessageRequest,
                             context) -> AsyncIterator[spb.ReceiveMessageResponse]:
        try:
            popped, invisible_ms = await self._receive(request, context)
        except GrpcError as exc:
            yield spb.ReceiveMessageResponse(status=status(exc.code, exc.message))
            yield spb.ReceiveMessageResponse(delivery_timestamp=timestamp(_now_ms()))
            return
        if not popped:
            yield spb.ReceiveMessageResponse(
                status=status(Code.MESSAGE_NOT_FOUND, "no new message"))
            yield spb.ReceiveMessageResponse(delivery_timestamp=timestamp(_now_ms()))
            return
        group = request.group.name
        sent = 0
        try:
            yield spb.ReceiveMessageResponse(status=status())
            for p in popped:
                yield spb.ReceiveMessageResponse(message=self.to_pb(
                    p.message, receipt_handle=p.handle, delivery_attempt=p.attempt,
                    invisible_ms=invisible_ms))
                sent += 1
            yield spb.ReceiveMessageResponse(delivery_timestamp=timestamp(_now_ms()))
        finally:
            if sent < len(popped):  # the client went away: visible again now, not later
                task = asyncio.get_running_loop().create_task(
                    self._release(group, popped[sent:]), name="grpc-receive-release")
                task.add_done_callback(_log_failure)

    async def _receive(self, request: spb.ReceiveMessageRequest, context) -> tuple[list[Popped], int]:
        group = request.group.name
        topic = request.message_queue.topic.name
        if not group:
            raise GrpcError(Code.ILLEGAL_CONSUMER_GROUP, "the consumer group is empty")
        if not topic:
            raise GrpcError(Code.ILLEGAL_TOPIC, "the topic is empty")
        poll_ms = self._polling_ms(request, context)
        renew_ms, owner = 0, ""
        if request.auto_renew:
            invisible_ms = AUTO_RENEW_INVISIBLE_MS
            owner = self.client_id(context, required=False)
            renew_ms = AUTO_RENEW_MAX_MS if owner else 0
        else:
            invisible_ms = duration_ms(request.invisible_duration)
            cfg = self.config
            if not cfg.pop_min_invisible_ms <= invisible_ms <= cfg.pop_max_invisible_ms:
                raise GrpcError(Code.ILLEGAL_INVISIBLE_TIME,
                                f"invisible duration {invisible_ms} ms is not in "
                                f"{cfg.pop_min_invisible_ms}..{cfg.pop_max_invisible_ms} ms")
        tags = self._tags(request.filter_expression)
        batch = request.batch_size
        if not 1 <= batch <= self.config.pop_max_batch:
            raise GrpcError(Code.BAD_REQUEST,
                            f"batch size {batch} is not in 1..{self.config.pop_max_batch}")
        try:
            popped = await self.pop.pop(
                group, topic, batch_size=batch, invisible_ms=invisible_ms,
                fifo=self.is_fifo_group(group), tags=tags,
                attempt_id=request.attempt_id if request.HasField("attempt_id") else "",
                poll_ms=poll_ms, renew_ms=renew_ms, owner=owner)
        except PopError as exc:
            raise refused(exc) from None
        return popped, invisible_ms

    def _polling_ms(self, request: spb.ReceiveMessageRequest, context) -> int:
        remaining = context.time_remaining()
        remaining_ms = int(remaining * 1000) if remaining is not None else MAX_POLL_MS * 2
        if request.HasField("long_polling_timeout"):
            poll = duration_ms(request.long_polling_timeout)
        else:
            poll = remaining_ms - self._request_timeout_ms(context) // 2
        return max(0, min(poll, MAX_POLL_MS, remaining_ms - DEADLINE_MARGIN_MS))

    def _request_timeout_ms(self, context) -> int:
        session = self.sessions.get(self.client_id(context, required=False))
        settings = session.settings if session is not None else None
        if settings is not None and settings.HasField("request_timeout"):
            return duration_ms(settings.request_timeout)
        return DEFAULT_REQUEST_TIMEOUT_MS

    @staticmethod
    def _tags(expression: pb.FilterExpression) -> frozenset[str] | None:
        if expression.type == pb.SQL:
            raise GrpcError(Code.ILLEGAL_FILTER_EXPRESSION,
                            "SQL92 filters are not supported: filter by tag")
        try:
            selected = parse_tag_expression(expression.expression or "*")
        except HeaderError as exc:
            raise GrpcError(Code.ILLEGAL_FILTER_EXPRESSION, str(exc)) from None
        return None if selected.matches_all else selected.tags

    async def _release(self, group: str, unsent: list[Popped]) -> None:
        for p in unsent:
            try:
                await self.pop.change_invisible(group, p.handle, self.config.pop_min_invisible_ms)
            except PopError:
                pass  # acknowledged or delivered again meanwhile: nothing to release

    # --- AckMessage, ChangeInvisibleDuration, ForwardMessageToDeadLetterQueue ------------------
    async def AckMessage(self, request: spb.AckMessageRequest, context) -> spb.AckMessageResponse:
        group, topic = request.group.name, request.topic.name
        entries = []
        for entry in request.entries:
            try:
                await self.pop.ack(group, entry.receipt_handle, topic)
                st = status()
            except PopError as exc:
                err = refused(exc)
                st = status(err.code, err.message)
            entries.append(spb.AckMessageResultEntry(
                message_id=entry.message_id, receipt_handle=entry.receipt_handle, status=st))
        codes = {e.status.code for e in entries}
        if not codes:
            overall = status(Code.BAD_REQUEST, "no entry to acknowledge")
        elif len(codes) > 1:
            overall = status(Code.MULTIPLE_RESULTS, "the entries have different results")
        else:
            overall = entries[0].status
        return spb.AckMessageResponse(status=overall, entries=entries)

    async def ChangeInvisibleDuration(self, request: spb.ChangeInvisibleDurationRequest,
                                      context) -> spb.ChangeInvisibleDurationResponse:
        invisible_ms = duration_ms(request.invisible_duration)
        cfg = self.config
        # From 0, as the proxy accepts: the Node.js PushConsumer nacks a failed message with
        # 0 ms and retries a refusal without end (docs/grpc.md, "Node.js client").
        if not 0 <= invisible_ms <= cfg.pop_max_invisible_ms:
            raise GrpcError(Code.ILLEGAL_INVISIBLE_TIME,
                            f"invisible duration {invisible_ms} ms is not in "
                            f"0..{cfg.pop_max_invisible_ms} ms")
        try:
            p = await self.pop.change_invisible(request.group.name, request.receipt_handle,
                                                invisible_ms, request.topic.name)
        except PopError as exc:
            raise refused(exc) from None
        return spb.ChangeInvisibleDurationResponse(status=status(), receipt_handle=p.handle)

    async def ForwardMessageToDeadLetterQueue(
            self, request: spb.ForwardMessageToDeadLetterQueueRequest,
            context) -> spb.ForwardMessageToDeadLetterQueueResponse:
        try:
            await self.pop.to_dead_letters(request.group.name, request.receipt_handle,
                                           request.topic.name)
        except PopError as exc:
            raise refused(exc) from None
        return spb.ForwardMessageToDeadLetterQueueResponse(status=status())

    # --- QueryAssignment ----------------------------------------------------------------------
    async def QueryAssignment(self, request: spb.QueryAssignmentRequest,
                              context) -> spb.QueryAssignmentResponse:
        """Every broker group's readable queues (in a cluster, as QueryRoute lists them), or
        for a plain group one "any queue" (id -1) per broker group."""
        topic, namespace = request.topic.name, request.topic.resource_namespace
        tc = self.topics.get(topic)
        if self.cluster is not None:
            queues = await self.cluster.queues(topic, tc, namespace)
        elif tc is not None:
            queues = message_queues(tc, self.broker_name, self.here(), namespace)
        else:
            queues = []
        queues = [q for q in queues if q.permission in (pb.READ, pb.READ_WRITE)]
        if not queues:
            raise GrpcError(Code.TOPIC_NOT_FOUND, f"topic {topic!r} has no readable queue")
        if not self.is_fifo_group(request.group.name):
            per_broker: dict[str, pb.MessageQueue] = {}
            for q in queues:
                if q.broker.name not in per_broker:
                    any_queue = per_broker[q.broker.name] = pb.MessageQueue()
                    any_queue.CopyFrom(q)
                    any_queue.id = -1
            queues = list(per_broker.values())
        return spb.QueryAssignmentResponse(
            status=status(), assignments=[pb.Assignment(message_queue=q) for q in queues])


def _now_ms() -> int:
    return int(time.time() * 1000)


def _log_failure(task: asyncio.Task) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.error("releasing unsent POP messages failed", exc_info=task.exception())
