"""Request handlers for transactions: END_TRANSACTION, RESUME_CHECK_HALF_MESSAGE and the
txbroker admin requests TXN_LIST / TXN_SHOW / TXN_DECIDE and, when the Kafka listener is on,
KAFKA_TXN_LIST / KAFKA_TXN_ABORT (Kafka transactions, through the transaction coordinator).

Handlers decode typed headers (``remoting.headers``) and call the service; its refusals
(:class:`~txbroker.service.transaction.state.TransactionError`, header errors: all
:class:`~txbroker.remoting.errors.Refusal`) propagate to the transport, which answers them with
RocketMQ's code and a remark.  TXN_SHOW and TXN_DECIDE answer an id the broker does not know
with QUERY_NOT_FOUND and a contradicting decision with TRANSACTION_FAILED; a decided id is
answered from the decision history.

END_TRANSACTION is one-way from Java clients (flag 2: never answered, even on error — the
error is logged and counted), but the C++ client sends it with flag 0 (docs/protocol.md §8.1)
and then gets an answer, which it ignores harmlessly.

Kafka transactions (docs/kafka.md, "Operating Kafka transactions"): KAFKA_TXN_LIST answers a
JSON array of transactional ids (:func:`kafka_txn_doc`), empty on a broker without the Kafka
listener, so one operator command can ask every broker; TXN_SHOW answers a Kafka transactional
id when no half message has that id (a half's id is a 32-hex UNIQ_KEY or offsetMsgId, which a
Kafka application rarely picks); KAFKA_TXN_ABORT aborts an open transaction as an operator,
which bumps the producer's epoch: the running producer is fenced, as a zombie would be.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Coroutine
from typing import TYPE_CHECKING, Any

import orjson

from txbroker.remoting.codes import FLAG_ONEWAY, RequestCode, ResponseCode
from txbroker.remoting.command import RemotingCommand
from txbroker.remoting.errors import Refusal
from txbroker.remoting.headers import (
    EndTransactionRequestHeader,
    KafkaTxnAbortRequestHeader,
    KafkaTxnListRequestHeader,
    ResumeCheckHalfMessageRequestHeader,
    TxnDecideRequestHeader,
    TxnListRequestHeader,
    TxnShowRequestHeader,
)
from txbroker.service.transaction.service import TransactionalMessageService
from txbroker.service.transaction.state import UnknownTransactionError

if TYPE_CHECKING:
    from txbroker.service.kafka.coordinator import TransactionCoordinator
    from txbroker.service.kafka.txn_record import TxnView

log = logging.getLogger(__name__)

Handler = Callable[[Any, RemotingCommand], Awaitable[RemotingCommand | None]]

def kafka_txn_doc(view: TxnView, now_ms: int) -> dict:
    """A Kafka transaction as the operator requests answer it: the view's fields, plus
    ``kind`` "kafka", ``age_ms`` (since the transaction started, or since the id's last
    change when none is open) and ``hanging`` (open past its timeout)."""
    since = view.started_ms if view.started_ms is not None else view.updated_ms
    return {"kind": "kafka", "transactional_id": view.transactional_id,
            "producer_id": view.producer_id, "producer_epoch": view.producer_epoch,
            "state": view.state, "partitions": [[t, p] for t, p in view.partitions],
            "groups": list(view.groups), "timeout_ms": view.timeout_ms,
            "started_ms": view.started_ms, "updated_ms": view.updated_ms,
            "age_ms": max(now_ms - since, 0), "hanging": view.hanging(now_ms)}


def _ended(cmd: RemotingCommand) -> RemotingCommand | None:
    """A one-way END (every producer's) gets no answer: build none."""
    return None if cmd.flag & FLAG_ONEWAY else cmd.response(ResponseCode.SUCCESS)


def _log_end_refusal(conn: Any, cmd: RemotingCommand, exc: Refusal) -> None:
    """Logged: a Java producer's END_TRANSACTION is never answered."""
    log.info("END_TRANSACTION from %s refused: %s (ext %s)", getattr(conn, "peer", "?"),
             exc.remark, {k: v for k, v in cmd.ext_fields.items() if k != "Signature"})


def transaction_handlers(tx: TransactionalMessageService,
                         kafka: TransactionCoordinator | None = None) -> dict[int, Handler]:
    """Request code → handler, for ``RemotingServer.register``; ``kafka`` is the Kafka
    listener's transaction coordinator (None when the listener is off)."""

    def end_transaction(conn: Any, cmd: RemotingCommand) -> RemotingCommand | None | Coroutine:
        """Applied right here when the service can (:meth:`can_end_now`: no coroutine);
        otherwise the rest is a coroutine for the transport to run."""
        try:
            if not tx.active:  # a slave (RocketMQ answers SLAVE_NOT_AVAILABLE too)
                raise Refusal(ResponseCode.SLAVE_NOT_AVAILABLE,
                              "this broker is not its group's master: END_TRANSACTION refused")
            h = EndTransactionRequestHeader.from_ext(cmd.ext_fields)
            if tx.can_end_now(h.commit_log_offset):
                tx.end_transaction_now(
                    commit_log_offset=h.commit_log_offset,
                    tran_state_table_offset=h.tran_state_table_offset,
                    producer_group=h.producer_group, commit_or_rollback=h.commit_or_rollback,
                    from_check=h.from_transaction_check)
                return _ended(cmd)
        except Refusal as exc:
            _log_end_refusal(conn, cmd, exc)
            raise
        return _end_later(conn, cmd, h)

    async def _end_later(conn: Any, cmd: RemotingCommand,
                         h: EndTransactionRequestHeader) -> RemotingCommand | None:
        try:
            await tx.end_transaction(
                commit_log_offset=h.commit_log_offset,
                tran_state_table_offset=h.tran_state_table_offset,
                producer_group=h.producer_group, commit_or_rollback=h.commit_or_rollback,
                from_check=h.from_transaction_check)
        except Refusal as exc:
            _log_end_refusal(conn, cmd, exc)
            raise
        return _ended(cmd)

    async def resume_check(conn: Any, cmd: RemotingCommand) -> RemotingCommand:
        h = ResumeCheckHalfMessageRequestHeader.from_ext(cmd.ext_fields)
        try:
            await tx.operator_decide(h.msg_id, "resume", operator="RESUME_CHECK_HALF_MESSAGE",
                                     peer=getattr(conn, "peer", ""))
        except UnknownTransactionError as exc:  # RocketMQ answers a message it cannot find so
            raise Refusal(ResponseCode.SYSTEM_ERROR, exc.remark) from None
        return cmd.response(ResponseCode.SUCCESS)

    async def txn_list(conn: Any, cmd: RemotingCommand) -> RemotingCommand:
        h = TxnListRequestHeader.from_ext(cmd.ext_fields)
        rows = tx.list_halves(h.state, topic=h.topic, group=h.producer_group, limit=h.limit)
        return cmd.response(ResponseCode.SUCCESS, body=orjson.dumps(rows))

    async def txn_show(conn: Any, cmd: RemotingCommand) -> RemotingCommand:
        h = TxnShowRequestHeader.from_ext(cmd.ext_fields)
        doc = tx.show(h.id)
        if doc is None and kafka is not None:
            view = kafka.describe(h.id)
            doc = None if view is None else kafka_txn_doc(view, kafka.now_ms())
        if doc is None:
            raise UnknownTransactionError(h.id)
        return cmd.response(ResponseCode.SUCCESS, body=orjson.dumps(doc))

    async def txn_decide(conn: Any, cmd: RemotingCommand) -> RemotingCommand:
        h = TxnDecideRequestHeader.from_ext(cmd.ext_fields)
        doc = await tx.operator_decide(h.id, h.decision, operator=h.operator,
                                       peer=getattr(conn, "peer", ""), reason=h.reason)
        return cmd.response(ResponseCode.SUCCESS, body=orjson.dumps(doc))

    async def kafka_txn_list(conn: Any, cmd: RemotingCommand) -> RemotingCommand:
        h = KafkaTxnListRequestHeader.from_ext(cmd.ext_fields)
        now_ms = 0 if kafka is None else kafka.now_ms()
        views = [] if kafka is None else kafka.transactions()
        rows = [kafka_txn_doc(v, now_ms) for v in sorted(views, key=lambda v: v.transactional_id)
                if (not h.hanging or v.hanging(now_ms))
                and (not h.open_only or v.open)]
        return cmd.response(ResponseCode.SUCCESS, body=orjson.dumps(rows))

    async def kafka_txn_abort(conn: Any, cmd: RemotingCommand) -> RemotingCommand:
        h = KafkaTxnAbortRequestHeader.from_ext(cmd.ext_fields)
        if kafka is None or kafka.describe(h.transactional_id) is None:
            raise Refusal(ResponseCode.QUERY_NOT_FOUND,
                          f"no Kafka transactional id {h.transactional_id}")
        outcome = await kafka.abort(h.transactional_id, h.operator)
        log.warning("Kafka transaction %s: operator %s (from %s) abort: %s", h.transactional_id,
                    h.operator, getattr(conn, "peer", "?"), outcome)
        view = kafka.describe(h.transactional_id)
        doc = {} if view is None else kafka_txn_doc(view, kafka.now_ms())
        return cmd.response(ResponseCode.SUCCESS, body=orjson.dumps({**doc, "outcome": outcome}))

    return {
        RequestCode.KAFKA_TXN_LIST: kafka_txn_list,
        RequestCode.KAFKA_TXN_ABORT: kafka_txn_abort,
        RequestCode.END_TRANSACTION: end_transaction,
        RequestCode.RESUME_CHECK_HALF_MESSAGE: resume_check,
        RequestCode.TXN_LIST: txn_list,
        RequestCode.TXN_SHOW: txn_show,
        RequestCode.TXN_DECIDE: txn_decide,
    }
