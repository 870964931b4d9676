"""The producer: route lookup, queue choice, SEND_MESSAGE_V2 with retries on another queue.

A send is one SEND_MESSAGE_V2 request (RocketMQ's default, short header keys) to the master of
the chosen queue's broker group.  Queues of every group with a master are used in turn; the
latency fault tolerance (``faults.py``) keeps a group that failed or answered slowly out of
the rotation for a back-off.  A failed attempt (time-out, broken connection, or a broker error
that another queue may not repeat) is retried on another group's queue when there is one, up
to ``retries`` more times; the message keeps its UNIQ_KEY across attempts (as the Java client
does), so a retry of a send whose answer was lost is recognisable downstream.  When every
attempt fails, :class:`SendError` lists each attempt with the broker's code and remark.

FLUSH_DISK_TIMEOUT, FLUSH_SLAVE_TIMEOUT and SLAVE_NOT_AVAILABLE answers are stored messages:
they are returned as the result's ``send_status`` and never retried (a retry would store a
duplicate), as RocketMQ's Java client does by default.

A topic the name server does not know is sent on the template topic's route, and the broker
creates it on that first send (RocketMQ's auto-create, which its clients rely on); the producer
notes such topics in ``created_topics`` so a caller can say so, since a misspelt topic would
otherwise be created without a word.  ``create_topics=False`` refuses them instead.
"""

from __future__ import annotations

import itertools
import logging
import ssl
import time
from collections.abc import Callable
from typing import Self, TypeVar

from txbroker.client.errors import (
    BrokerError,
    ClientError,
    ClientStateError,
    RouteError,
    SendError,
    TopicNotFoundError,
    code_name,
)
from txbroker.client.faults import FaultTracker
from txbroker.client.frames import FilledRequest, FrameTemplate
from txbroker.client.instance import DEFAULT_NAMESRV, ClientInstance
from txbroker.client.message import (
    DEFAULT_COMPRESS_THRESHOLD,
    DEFAULT_MAX_MESSAGE_SIZE,
    Message,
    SendResult,
    SendStatus,
    UniqKeyGenerator,
    validate_topic,
    wire_body,
)
from txbroker.client.namesrv import TopicRoute
from txbroker.client.rebalance import MessageQueue
from txbroker.remoting.codes import RequestCode, ResponseCode
from txbroker.remoting.command import RemotingCommand
from txbroker.remoting.headers import (
    SEND_V1_KEYS,
    HeaderError,
    RecallMessageRequestHeader,
    RecallMessageResponseHeader,
    SendMessageRequestHeader,
    SendMessageResponseHeader,
)
from txbroker.remoting.recall import decode_handle
from txbroker.remoting.tls import ClientTLS
from txbroker.store import record as rec

log = logging.getLogger(__name__)

#: The result class a send builds (SendResult, or a transaction's TransactionSendResult).
R = TypeVar("R", bound=SendResult)

#: Template topic for auto-created topics (RocketMQ's TBW102) and its queue count.
DEFAULT_TOPIC = rec.DEFAULT_TOPIC
DEFAULT_TOPIC_QUEUE_NUMS = 4
#: Broker answers worth retrying on another queue (RocketMQ's retryResponseCodes minus
#: NO_PERMISSION, which another queue of the same topic repeats).
RETRY_CODES = frozenset({ResponseCode.SYSTEM_ERROR, ResponseCode.SYSTEM_BUSY,
                         ResponseCode.SERVICE_NOT_AVAILABLE, ResponseCode.TOPIC_NOT_EXIST})
_STATUS_BY_CODE = {s.value: s for s in SendStatus}
#: A send is its (topic, flags) frame template with these three fields filled in
#: (``frames.py``): encoding the whole header per send cost more than the rest of the send.
SEND_HOLES = tuple(SEND_V1_KEYS[k] for k in ("queueId", "bornTimestamp", "properties"))
SEND_INT_HOLES = frozenset(SEND_HOLES[:2])
#: A batch request's own properties (each message carries its own inside the body).
_BATCH_PROPERTIES = rec.properties_to_string({rec.PROPERTY_WAIT_STORE_MSG_OK: "true"})
#: Templates kept per producer (a producer writing to many topics starts over past this).
MAX_HEADER_TEMPLATES = 256


def validate_group(group: object, what: str = "group") -> str:
    """Group names follow RocketMQ's rule, the broker's too (``[%|a-zA-Z0-9_-]``, no ``.``), at
    most 120 characters so that ``%RETRY%<group>`` is still a name RocketMQ clients can use;
    ``what`` ("producer group", "consumer group") names the group in the error."""
    limit = rec.MAX_TOPIC_BYTES - len(rec.RETRY_GROUP_TOPIC_PREFIX)
    if not isinstance(group, str) or not group:
        raise ValueError(f"{what} must be a non-empty string")
    if len(group) > limit:
        raise ValueError(f"{what} {group[:20]!r}... is longer than {limit} characters")
    if not rec.GROUP_NAME_RE.match(group):
        raise ValueError(f"{what} {group!r} may only contain letters, digits, '%', '|', '_' and '-'")
    return group


class Producer:
    """Sends messages; ``async with Producer("PG") as p: await p.send(Message(...))``.

    ``max_message_size`` is the broker's ``max_message_size`` (4 MiB unless the broker was
    configured otherwise; like RocketMQ's client, the producer is told, it does not ask): a
    body larger than that as sent, i.e. after compression, is refused before it leaves.
    ``compress_threshold``: bodies of at least this many bytes are compressed when that
    shrinks them (0 = never).

    ``access_key``/``secret_key`` (RocketMQ's SessionCredentials) sign every request, for
    brokers that run access control; leave them unset otherwise.
    ``tls`` (a :class:`~txbroker.remoting.tls.ClientTLS` or an ``ssl.SSLContext``) makes every
    connection TLS, verifying the broker's certificate and host name (docs/security.md "TLS").

    ``send_latency_fault`` (on by default, unlike RocketMQ) avoids a broker group for a
    back-off after it failed or answered slowly (``faults.py``); ``fault_clock`` is the
    monotonic clock (seconds) those back-offs are measured on.

    ``create_topics`` (on by default, as in RocketMQ): a send to a topic the name server does
    not know goes on the template route and the broker creates the topic (when its
    ``auto_create_topic`` allows); the topic is then added to ``created_topics``.  Off, such a
    send raises :class:`TopicNotFoundError` at once and nothing is sent.
    """

    def __init__(self, group: str, namesrv: str = DEFAULT_NAMESRV, send_timeout: float = 3.0,
                 retries: int = 2, *, max_message_size: int = DEFAULT_MAX_MESSAGE_SIZE,
                 compress_threshold: int = DEFAULT_COMPRESS_THRESHOLD, heartbeat_interval: float = 30.0,
                 instance_name: str | None = None, access_key: str | None = None,
                 secret_key: str | None = None, send_latency_fault: bool = True,
                 fault_clock: Callable[[], float] = time.monotonic,
                 create_topics: bool = True,
                 tls: ClientTLS | ssl.SSLContext | None = None) -> None:
        self.group = validate_group(group, "producer group")
        if not isinstance(retries, int) or retries < 0:
            raise ValueError("retries must be a non-negative integer")
        if send_timeout <= 0:
            raise ValueError("send_timeout must be positive")
        self.send_timeout = float(send_timeout)
        self.retries = retries
        self.max_message_size = max_message_size
        self.compress_threshold = compress_threshold
        self.create_topics = create_topics
        #: Topics this producer's sends created: stored on the template route, i.e. unknown
        #: to the name server when sent (another client may have created one meanwhile).
        self.created_topics: set[str] = set()
        #: Topics whose last route lookup answered the template route.
        self._template_routed: set[str] = set()
        self._instance = ClientInstance(namesrv, request_timeout=self.send_timeout,
                                        heartbeat_interval=heartbeat_interval,
                                        instance_name=instance_name,
                                        access_key=access_key, secret_key=secret_key,
                                        tls=tls)
        self._instance.producer_groups.add(self.group)
        self._ids = UniqKeyGenerator(self._instance.ip)
        self._rr = itertools.count()
        #: Broker groups avoided after failures or slow answers (RocketMQ's MQFaultStrategy).
        self.faults = FaultTracker(enabled=send_latency_fault, clock=fault_clock)
        #: topic -> (the name server's route object, its writable queues): a send reuses the
        #: queue list while that route is the cached one; a refreshed route is a new object.
        self._write_queues: dict[str, tuple[TopicRoute, list[MessageQueue]]] = {}
        #: (topic, sys flag, batch, one-way) -> the send's frame, encoded but for its holes.
        self._send_frames: dict[tuple[str, int, bool, bool], FrameTemplate] = {}
        self._state = "new"

    @property
    def client_id(self) -> str:
        return self._instance.client_id

    async def start(self) -> None:
        """Connect to the name server and heartbeat every broker (before any send)."""
        if self._state != "new":
            raise ClientStateError(f"producer {self.group} cannot start: it is {self._state}")
        self._state = "starting"
        try:
            await self._instance.start()
            self._ids = UniqKeyGenerator(self._instance.ip)
        except BaseException:
            self._state = "new"  # start() may be called again (the broker may come up later)
            raise
        self._state = "running"

    async def shutdown(self) -> None:
        if self._state in ("closed", "new"):
            self._state = "closed"
            return
        self._state = "closed"
        await self._instance.shutdown()

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.shutdown()

    def _check_running(self) -> None:
        if self._state != "running":
            raise ClientStateError(f"producer {self.group} is {self._state}; call start() first"
                                   if self._state == "new" else
                                   f"producer {self.group} is {self._state}")

    # --- public sends ----------------------------------------------------------------------
    async def send(self, msg: Message, queue: MessageQueue | None = None) -> SendResult:
        """Send one message and wait until the broker stored it.

        ``queue`` (RocketMQ's ``send(msg, mq)``) stores it in that queue of ``msg.topic``:
        retries stay on it, since a caller who picked a queue (an end marker per queue, an
        ordered key) means that one and no other."""
        self._check_running()
        msg.validate()
        if queue is not None and queue.topic != msg.topic:
            raise ValueError(f"queue {queue} is not a queue of topic {msg.topic!r}")
        body, sys_flag = wire_body(msg.body, self.compress_threshold, self.max_message_size)
        uniq = self._ids.next()
        return await self._send(msg.topic, body, msg.wire_properties_text(uniq), sys_flag, uniq,
                                queue=queue)

    async def send_oneway(self, msg: Message) -> None:
        """Send without waiting for the broker (no result, no retry: delivery is best effort)."""
        self._check_running()
        msg.validate()
        body, sys_flag = wire_body(msg.body, self.compress_threshold, self.max_message_size)
        uniq = self._ids.next()
        queues = await self._queues(msg.topic)
        mq = self.faults.select(queues, next(self._rr), None)
        cmd = self._request(mq, body, msg.wire_properties_text(uniq), sys_flag, batch=False,
                            oneway=True)
        await self._instance.invoke_oneway(self._instance.namesrv.broker_addr(mq.broker_name), cmd)

    async def send_batch(self, msgs: list[Message]) -> SendResult:
        """Send messages of one topic as one request, stored contiguously in one queue.

        ``msg_id`` and ``offset_msg_id`` of the result are comma-joined, one per message.
        """
        self._check_running()
        msgs = list(msgs)
        if not msgs:
            raise ValueError("send_batch needs at least one message")
        topic = msgs[0].topic
        items, uniqs = [], []
        for i, m in enumerate(msgs):
            m.validate()
            if m.topic != topic:
                raise ValueError(f"batch message {i} is for topic {m.topic!r}, not {topic!r}")
            if m.delay_level or m.deliver_time_ms is not None:
                raise ValueError(f"batch message {i} has a delay level or delivery time; "
                                 "batches cannot be delayed")
            uniq = self._ids.next()
            uniqs.append(uniq)
            items.append((0, bytes(m.body), m.wire_properties(uniq)))
        body = rec.encode_batch(items)
        if len(body) > self.max_message_size:  # batches go uncompressed, as in RocketMQ
            raise ValueError(f"batch body is {len(body):,} bytes, over the "
                             f"{self.max_message_size:,}-byte limit")
        return await self._send(topic, body, _BATCH_PROPERTIES, 0, ",".join(uniqs), batch=True)

    async def recall(self, topic: str, recall_handle: str) -> str:
        """Cancel a timer message before its delivery (RocketMQ 5.3's RECALL_MESSAGE), by the
        ``recall_handle`` of its :class:`SendResult`; returns its message id.  Raises
        ValueError for a handle that is not one, :class:`BrokerError` when the broker refuses
        (too late, unknown, another topic: its remark says which)."""
        self._check_running()
        validate_topic(topic)
        handle = decode_handle(recall_handle)
        namesrv = self._instance.namesrv
        if handle.broker_name not in namesrv.groups:
            await namesrv.refresh_cluster()
        addr = namesrv.broker_addr(handle.broker_name)
        cmd = RemotingCommand.request(RequestCode.RECALL_MESSAGE, RecallMessageRequestHeader(
            producer_group=self.group, topic=topic, recall_handle=recall_handle).to_ext())
        resp = await self._instance.invoke(addr, cmd, self.send_timeout)
        if resp.code != ResponseCode.SUCCESS:
            raise BrokerError("recall", resp.code, resp.remark, addr)
        return RecallMessageResponseHeader.from_ext(resp.ext_fields).msg_id

    # --- internals ---------------------------------------------------------------------------
    def _cached_queues(self, topic: str) -> list[MessageQueue] | None:
        """The writable queues of ``topic`` while its cached route is unchanged, else None."""
        entry = self._write_queues.get(topic)
        if entry is not None and self._instance.namesrv.routes.get(topic) is entry[0]:
            return entry[1]
        return None

    async def _queues(self, topic: str, refresh: bool = False) -> list[MessageQueue]:
        if not refresh:
            queues = self._cached_queues(topic)
            if queues is not None:
                return queues
        namesrv = self._instance.namesrv
        if self.create_topics:
            route = await namesrv.publish_route(topic, DEFAULT_TOPIC_QUEUE_NUMS, refresh=refresh)
        else:
            route = await namesrv.route(topic, refresh=refresh)
        queues = route.write_queues()
        if not queues:
            raise RouteError(f"topic {topic!r} has no writable queue")
        if namesrv.routes.get(topic) is route:  # not an auto-create template route
            self._write_queues[topic] = (route, queues)
            self._template_routed.discard(topic)
        else:
            self._template_routed.add(topic)
        return queues

    def _request(self, mq: MessageQueue, body: bytes, props: str, sys_flag: int,
                 *, batch: bool, oneway: bool = False) -> FilledRequest:
        key = (mq.topic, sys_flag, batch, oneway)
        template = self._send_frames.get(key)
        if template is None:
            if len(self._send_frames) >= MAX_HEADER_TEMPLATES:
                self._send_frames.clear()
            code = RequestCode.SEND_BATCH_MESSAGE if batch else RequestCode.SEND_MESSAGE_V2
            ext = SendMessageRequestHeader(
                producer_group=self.group, topic=mq.topic, default_topic=DEFAULT_TOPIC,
                default_topic_queue_nums=DEFAULT_TOPIC_QUEUE_NUMS, queue_id=0,
                sys_flag=sys_flag, born_timestamp=0, flag=0, properties="", reconsume_times=0,
                unit_mode=False, batch=batch).to_ext_v2()
            template = self._send_frames[key] = FrameTemplate(
                code, ext, SEND_HOLES, ints=SEND_INT_HOLES, oneway=oneway)
        return FilledRequest(template, (mq.queue_id, int(time.time() * 1000), props), body)

    async def _send(self, topic: str, body: bytes, props: str, sys_flag: int,
                    msg_id: str, *, batch: bool = False, queue: MessageQueue | None = None,
                    result_type: type[R] = SendResult) -> R:  # type: ignore[assignment]
        """Send, retrying on another queue.

        A transaction's half whose outcome is unknown (sent, then no answer, a dropped
        connection or an OUTCOME_UNKNOWN refusal) is retried on the *same* queue only: its
        group's master answers a retry of a pending half with the first half's ids and stores
        nothing (``TransactionService._retried_half``), where a half sent to another group
        would be a second transaction under the same id, checked back and committed too
        (docs/reliability.md, "Faults we test").  When no retry settles it, the SendError says
        ``may_be_stored``: the local transaction does not run and the check-back decides it."""
        attempts: list[str] = []
        last: BaseException | None = None
        failed_broker: str | None = None
        half = bool(sys_flag & rec.TRANSACTION_PREPARED_TYPE)
        #: A half's queue after an unknown outcome: every later attempt goes there.
        pinned: MessageQueue | None = None
        start = next(self._rr)
        for attempt in range(self.retries + 1):
            # A first attempt on an unchanged route needs no coroutine to find its queues.
            queues = self._cached_queues(topic) if attempt == 0 else None
            if queues is None:
                try:
                    queues = await self._queues(topic, refresh=attempt > 0 and last is not None)
                except (ClientError, OSError, TimeoutError) as exc:
                    if isinstance(exc, TopicNotFoundError) and not self.create_topics:
                        raise  # the caller chose not to create it: no retry can help
                    attempts.append(f"attempt {attempt + 1}: {exc}")
                    last = exc
                    continue
            mq = pinned or queue or self.faults.select(queues, start + attempt, failed_broker)
            addr = "?"
            began = time.monotonic()
            reachable = True
            sent = False
            try:
                addr = self._instance.namesrv.broker_addr(mq.broker_name)
                cmd = self._request(mq, body, props, sys_flag, batch=batch)
                if half and not self._instance.connected(addr):
                    # A failure to connect sends nothing: not an unknown outcome.
                    await self._instance.connection(addr)
                sent = True
                resp = await self._instance.invoke(addr, cmd, self.send_timeout)
            except TimeoutError as exc:
                last = exc
                attempts.append(f"attempt {attempt + 1} queue {mq.queue_id} on {addr}: "
                                f"no answer within {self.send_timeout}s")
                unknown = sent
            except (OSError, ConnectionError, ClientError) as exc:
                last = exc
                reachable = not isinstance(exc, (OSError, ConnectionError))
                attempts.append(f"attempt {attempt + 1} queue {mq.queue_id} on {addr}: "
                                f"{type(exc).__name__}: {exc}")
                unknown = sent and not isinstance(exc, ClientError)
            else:
                status = _STATUS_BY_CODE.get(resp.code)
                if status is not None:
                    self.faults.update(mq.broker_name, (time.monotonic() - began) * 1000)
                    if topic in self._template_routed:
                        self.created_topics.add(topic)
                    return self._result(topic, mq, resp, status, msg_id, result_type)
                last = BrokerError("send", resp.code, resp.remark, addr)
                attempts.append(f"attempt {attempt + 1} queue {mq.queue_id} on {addr}: "
                                f"{code_name(resp.code)} ({resp.code}): {resp.remark or ''}".rstrip(": "))
                if resp.code not in RETRY_CODES:
                    self.faults.update(mq.broker_name, (time.monotonic() - began) * 1000)
                    break
                # SYSTEM_ERROR: OUTCOME_UNKNOWN, or a failure the broker cannot place before
                # the store.  The other retried codes refuse before anything is stored.
                unknown = resp.code == ResponseCode.SYSTEM_ERROR
            self.faults.update(mq.broker_name, (time.monotonic() - began) * 1000,
                               isolation=True, reachable=reachable)
            failed_broker = mq.broker_name
            if half and (unknown or pinned):
                pinned = mq
            log.info("producer %s: %s", self.group, attempts[-1])
        raise SendError(topic, attempts, last, may_be_stored=pinned is not None)

    @staticmethod
    def _result(topic: str, mq: MessageQueue, resp: RemotingCommand, status: SendStatus,
                msg_id: str, result_type: type[R]) -> R:
        """The stored send as ``result_type`` (a transaction's result is built at once, not
        copied from a SendResult)."""
        try:
            header = SendMessageResponseHeader.from_ext(resp.ext_fields)
        except HeaderError as exc:
            raise ClientError(f"send to {topic!r}: malformed response header: {exc.remark}") from None
        return result_type(send_status=status, msg_id=msg_id, offset_msg_id=header.msg_id,
                           queue_id=header.queue_id, queue_offset=header.queue_offset,
                           topic=topic, broker_name=mq.broker_name,
                           recall_handle=header.recall_handle)
