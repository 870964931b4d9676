"""Transactional producer: half message, local transaction, one-way END_TRANSACTION, check-backs.

The flow (docs/protocol.md §7): send the message as a *half* (property ``TRAN_MSG=true``, ``PGROUP`` =
group, sysFlag PREPARED) — stored, invisible; run ``execute_local_transaction``; send
END_TRANSACTION one-way naming the half by its commitlog offset (decoded from the response's
offsetMsgId) and half-queue offset, with 8 = commit, 12 = rollback, 0 = unknown.  Because that
last step is one-way and this process may die, the broker later asks any live producer of the
group with CHECK_TRANSACTION_STATE; :meth:`TransactionListener.check_local_transaction` answers
from durable state and the reply is END_TRANSACTION with ``fromTransactionCheck=true``.

Across several broker groups the half goes to whichever group the send picked, and END goes to
that group's master as the route names it at END time.  A half stored with
FLUSH_DISK_TIMEOUT, FLUSH_SLAVE_TIMEOUT or SLAVE_NOT_AVAILABLE *is* stored, so the local
transaction runs and its outcome is sent as for SEND_OK (RocketMQ's Java client rolls such
halves back, apache/rocketmq issue #3617).

Check-backs arrive on a broker connection's read path.  They are handed to a task at once and
run under a semaphore of ``check_concurrency``.  A check for a transaction whose check is still
running is answered once that one ends (the listener never runs twice at once for one
transaction, and runs once per check): the broker counted it, and a counted check left
unanswered brings its half closer to a discard although the producer was there.  Anything
beyond a bounded backlog is dropped (the broker asks again), so a check storm cannot grow
memory without bound.  A listener that raises counts as UNKNOW: the
broker will ask again, which is the safe answer when this process cannot tell.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from functools import cached_property

from txbroker.client.errors import ClientError, ClientStateError, RouteError
from txbroker.client.frames import FilledRequest, FrameTemplate
from txbroker.client.instance import DEFAULT_NAMESRV
from txbroker.client.message import (
    LocalTransactionState,
    Message,
    MessageExt,
    TransactionSendResult,
    wire_body,
)
from txbroker.client.producer import Producer
from txbroker.remoting.codes import RequestCode
from txbroker.remoting.command import RemotingCommand
from txbroker.remoting.headers import (
    CheckTransactionStateRequestHeader,
    EndTransactionRequestHeader,
    HeaderError,
)
from txbroker.store import record as rec

log = logging.getLogger(__name__)

_END_TRANSACTION = int(RequestCode.END_TRANSACTION)
#: The fields of END_TRANSACTION that differ per half.
END_HOLES = ("tranStateTableOffset", "commitLogOffset", "commitOrRollback", "msgId",
             "transactionId")
END_INT_HOLES = frozenset(END_HOLES[:3])
#: Check-backs waiting for a slot, per check_concurrency slot, before new ones are dropped.
BACKLOG_PER_SLOT = 16


class TransactionListener:
    """Implement both methods, each as a plain or an ``async`` method.

    ``execute_local_transaction(msg, arg)`` runs the local transaction for the half ``msg``
    (``msg.transaction_id`` is set) and returns a :class:`LocalTransactionState`; a plain
    method runs in the caller's task, as in Java.
    ``check_local_transaction(msg)`` answers a broker check-back for a half whose outcome the
    broker never learned; it must answer from durable state (a database row written in the same
    local transaction), never from memory, because the producer that ran it may be gone.  A
    plain method runs in a worker thread (at most ``check_concurrency`` at once), so it may
    block on its database; an ``async`` one runs on the event loop.
    """

    def execute_local_transaction(self, msg: MessageExt, arg: object) -> LocalTransactionState:
        raise NotImplementedError

    def check_local_transaction(self, msg: MessageExt) -> LocalTransactionState:
        raise NotImplementedError


async def _call(fn, *args, in_thread: bool = False) -> LocalTransactionState:
    """Call a listener method, plain or async.  ``in_thread`` runs a plain one in a worker
    thread, so a blocking database lookup cannot stall the event loop (Java runs check-backs
    on a thread pool for the same reason)."""
    if in_thread and not inspect.iscoroutinefunction(fn):
        result = await asyncio.to_thread(fn, *args)
    else:
        result = fn(*args)
        if result.__class__ is LocalTransactionState:  # a plain method's answer: done
            return result
    return await _settle(fn, result)


async def _settle(fn, result: object) -> LocalTransactionState:
    """What a listener method returned, awaited if it is awaitable, as its state."""
    if inspect.isawaitable(result):
        result = await result
    if not isinstance(result, LocalTransactionState):
        raise TypeError(f"{getattr(fn, '__name__', fn)} returned {result!r}, "
                        "not a LocalTransactionState")
    return result


class _HalfMessage(MessageExt):
    """The half as ``execute_local_transaction`` sees it: a :class:`MessageExt` whose
    properties map is parsed from the string sent on first read (listeners rarely read it,
    and building it per transaction cost more than the listener call)."""

    def __init__(self, msg: Message, uniq: str, props_text: str,
                 result: TransactionSendResult) -> None:
        # Not the dataclass __init__: the fields a send sets now, the others keep their
        # class defaults, the properties wait (as PulledMessage does).
        self.topic = msg.topic
        self.body = bytes(msg.body)
        self.tags = msg.tags
        self.keys = " ".join(msg.key_list()) or None
        self.msg_id = self.transaction_id = uniq
        self.offset_msg_id = result.offset_msg_id
        self.queue_id = result.queue_id
        self.queue_offset = result.queue_offset
        self.broker_name = result.broker_name
        self._props_text = props_text

    @cached_property
    def properties(self) -> dict[str, str]:  # type: ignore[override]
        return rec.string_to_properties(self._props_text)


class TransactionProducer(Producer):
    """A producer whose sends are tied to a local transaction through ``listener``."""

    def __init__(self, group: str, namesrv: str = DEFAULT_NAMESRV, *,
                 listener: TransactionListener, check_concurrency: int = 16,
                 send_timeout: float = 3.0, retries: int = 2, **kwargs) -> None:
        super().__init__(group, namesrv, send_timeout=send_timeout, retries=retries, **kwargs)
        if listener is None or not hasattr(listener, "execute_local_transaction") \
                or not hasattr(listener, "check_local_transaction"):
            raise ValueError("listener must implement execute_local_transaction and "
                             "check_local_transaction")
        if not isinstance(check_concurrency, int) or check_concurrency < 1:
            raise ValueError("check_concurrency must be a positive integer")
        self.listener = listener
        self.check_concurrency = check_concurrency
        self._check_slots = asyncio.Semaphore(check_concurrency)
        self._checks: dict[str, asyncio.Task] = {}
        #: transaction id -> (the latest check of it that came while its check ran, how many
        #: came): each is asked in turn when the running one ends.
        self._again: dict[str, tuple[tuple[str, MessageExt, str, int], int]] = {}
        self._instance.on_request(RequestCode.CHECK_TRANSACTION_STATE, self._on_check)
        #: A half's properties after the message's own, up to the transaction id's value.
        self._half_tail = rec.PROPERTY_SEPARATOR + rec.properties_to_string({
            rec.PROPERTY_TRANSACTION_PREPARED: "true", rec.PROPERTY_PRODUCER_GROUP: self.group,
            rec.PROPERTY_TRANSACTION_ID: ""})
        #: fromTransactionCheck -> this group's one-way END_TRANSACTION, encoded but for
        #: the half's offsets, the decision and its ids (``frames.py``).
        self._end_frames = {from_check: FrameTemplate(_END_TRANSACTION, EndTransactionRequestHeader(
            producer_group=self.group, tran_state_table_offset=0, commit_log_offset=0,
            commit_or_rollback=0, from_transaction_check=from_check, msg_id="-",
            transaction_id="-").to_ext(), END_HOLES, ints=END_INT_HOLES, oneway=True)
            for from_check in (False, True)}

    async def shutdown(self) -> None:
        self._again.clear()  # before the cancels: a cancelled check starts no other
        checks = list(self._checks.values())
        for task in checks:
            task.cancel()
        if checks:
            await asyncio.gather(*checks, return_exceptions=True)
        await super().shutdown()

    async def send(self, msg: Message) -> TransactionSendResult:  # type: ignore[override]
        raise ClientStateError("a TransactionProducer sends with send_message_in_transaction()")

    async def send_message_in_transaction(self, msg: Message, arg: object = None) -> TransactionSendResult:
        """Send ``msg`` as a half, run the local transaction, then commit or roll back.

        Raises if the half could not be stored (then the local transaction does not run).
        """
        self._check_running()
        msg.validate()
        if msg.delay_level:
            raise ValueError("a transactional message cannot have a delay level")
        uniq = self._ids.next()
        body, sys_flag = wire_body(msg.body, self.compress_threshold, self.max_message_size)
        # The transaction id is the UNIQ_KEY; carried on the half (in the group's tail) so
        # every broker version hands it to check-backs and consumers (5.x brokers add it).
        props = msg.wire_properties_text(uniq, self._half_tail + uniq)
        result = await self._send(msg.topic, body, props, sys_flag | rec.TRANSACTION_PREPARED_TYPE,
                                  uniq, result_type=TransactionSendResult)
        result.transaction_id = uniq
        half = _HalfMessage(msg, uniq, props, result)
        state, error = LocalTransactionState.UNKNOW, None
        try:
            # A plain listener's answer needs no coroutine (_call for the other kinds).
            state = self.listener.execute_local_transaction(half, arg)
            if state.__class__ is not LocalTransactionState:
                state = await _settle(self.listener.execute_local_transaction, state)
        except Exception as exc:
            state, error = LocalTransactionState.UNKNOW, f"{type(exc).__name__}: {exc}"
            log.exception("producer %s: local transaction of %s failed; state UNKNOW "
                          "(the broker will check back)", self.group, uniq)
        result.local_transaction_state = state
        try:
            end = self._end_command(result.offset_msg_id, result.queue_offset, uniq, state,
                                    from_check=False, remark=error)
            try:  # the master as the route names it now; no coroutine while it names one
                addr = self._instance.namesrv.broker_addr(result.broker_name)
            except RouteError:
                addr = await self._end_addr(result.broker_name, msg.topic)
            if not self._instance.send_oneway_now(addr, end):  # sent at once when connected
                await self._instance.invoke_oneway(addr, end)
        except (ClientError, OSError, TimeoutError) as exc:
            # The half is stored and the broker will check back: not the caller's error.
            log.warning("producer %s: END_TRANSACTION for %s not sent (%s); the broker will "
                        "check back", self.group, uniq, exc)
        return result

    async def _end_addr(self, broker_name: str, topic: str) -> str:
        """The master of the group that stored the half when the route names none now: one
        route refresh (after a failover the group's new master holds the half at the same
        commitlog offset), else RouteError: then the END is not sent, and that group's
        master checks the half back later."""
        namesrv = self._instance.namesrv
        await namesrv.route(topic, refresh=True)
        return namesrv.broker_addr(broker_name)

    def _end_command(self, offset_msg_id: str, queue_offset: int, uniq: str,
                     state: LocalTransactionState, *, from_check: bool,
                     remark: str | None) -> RemotingCommand | FilledRequest:
        """The one-way END_TRANSACTION for the half ``offset_msg_id`` names: the group's END
        frame filled in (a remark, after a failed listener, makes it a command)."""
        try:
            commit_log_offset = rec.decode_offset_msg_id(offset_msg_id)[2]
        except ValueError as exc:
            raise ClientError(f"cannot end transaction {uniq}: bad offsetMsgId "
                              f"{offset_msg_id!r}: {exc}") from None
        end = self._end_frames[from_check].fill(
            (queue_offset, commit_log_offset, state.value, uniq, uniq))
        if remark:
            cmd = end.command()
            cmd.remark = remark[:512]
            return cmd
        return end

    async def _end(self, broker_name: str, offset_msg_id: str, queue_offset: int, uniq: str,
                   state: LocalTransactionState, *, from_check: bool, remark: str | None = None,
                   addr: str | None = None) -> None:
        cmd = self._end_command(offset_msg_id, queue_offset, uniq, state, from_check=from_check,
                                remark=remark)
        addr = addr or self._instance.namesrv.broker_addr(broker_name)
        # Connected and writable: sent at once, no coroutine (every commit takes this path).
        if not self._instance.send_oneway_now(addr, cmd):
            await self._instance.invoke_oneway(addr, cmd)

    # --- check-backs ---------------------------------------------------------------------------
    def _on_check(self, addr: str, cmd: RemotingCommand) -> None:
        """Read path: decode and hand off; never await the listener here."""
        try:
            header = CheckTransactionStateRequestHeader.from_ext(cmd.ext_fields)
            stored = rec.decode_record(cmd.body)
            msg = MessageExt.from_stored(stored)
        except (rec.RecordError, HeaderError) as exc:
            log.warning("producer %s: malformed check-back from %s ignored: %s", self.group, addr, exc)
            return
        group = msg.properties.get(rec.PROPERTY_PRODUCER_GROUP)
        if group != self.group:
            log.warning("producer %s: check-back for group %r ignored", self.group, group)
            return
        tx_id = header.transaction_id or header.msg_id or msg.msg_id
        msg.transaction_id = tx_id
        msg.msg_id = header.msg_id or msg.msg_id
        offset_msg_id = header.offset_msg_id or msg.offset_msg_id
        queue_offset = header.tran_state_table_offset
        if tx_id in self._checks:
            log.debug("producer %s: check of %s already running; answered after it",
                      self.group, tx_id)
            _, waiting = self._again.get(tx_id, (None, 0))
            self._again[tx_id] = ((addr, msg, offset_msg_id, queue_offset), waiting + 1)
            return
        if len(self._checks) >= self.check_concurrency * BACKLOG_PER_SLOT:
            log.warning("producer %s: %d check-backs pending; %s dropped (the broker asks again)",
                        self.group, len(self._checks), tx_id)
            return
        self._start_check(tx_id, addr, msg, offset_msg_id, queue_offset)

    def _start_check(self, tx_id: str, addr: str, msg: MessageExt, offset_msg_id: str,
                     queue_offset: int) -> None:
        task = asyncio.get_running_loop().create_task(
            self._check(addr, msg, tx_id, offset_msg_id, queue_offset))
        self._checks[tx_id] = task
        task.add_done_callback(lambda _t: self._check_ended(tx_id))

    def _check_ended(self, tx_id: str) -> None:
        self._checks.pop(tx_id, None)
        again = self._again.pop(tx_id, None)
        if again is not None:
            check, waiting = again
            if waiting > 1:
                self._again[tx_id] = (check, waiting - 1)
            self._start_check(tx_id, *check)

    async def _check(self, addr: str, msg: MessageExt, tx_id: str, offset_msg_id: str,
                     queue_offset: int) -> None:
        async with self._check_slots:
            error = None
            try:
                state = await _call(self.listener.check_local_transaction, msg, in_thread=True)
            except Exception as exc:
                state, error = LocalTransactionState.UNKNOW, f"{type(exc).__name__}: {exc}"
                log.exception("producer %s: check_local_transaction of %s failed; answering "
                              "UNKNOW", self.group, tx_id)
            try:
                await self._end("", offset_msg_id, queue_offset, msg.msg_id, state,
                                from_check=True, remark=error, addr=addr)
            except (ClientError, OSError, TimeoutError) as exc:
                log.warning("producer %s: answer to check of %s not sent: %s", self.group, tx_id, exc)
