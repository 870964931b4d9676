"""Request handlers for transactions: END_TRANSACTION, RESUME_CHECK_HALF_MESSAGE and the
txbroker admin requests TXN_LIST / TXN_SHOW / TXN_DECIDE.

Handlers decode typed headers (``remoting.headers``) and call the service; its refusals
(:class:`~txbroker.service.transaction.state.TransactionError`, header errors: all
:class:`~txbroker.remoting.errors.Refusal`) propagate to the transport, which answers them with
RocketMQ's code and a remark.  TXN_SHOW and TXN_DECIDE answer an id the broker does not know
with QUERY_NOT_FOUND and a contradicting decision with TRANSACTION_FAILED; a decided id is
answered from the decision history.

END_TRANSACTION is one-way from Java clients (flag 2: never answered, even on error — the
error is logged and counted), but the C++ client sends it with flag 0 (docs/protocol.md §8.1)
and then gets an answer, which it ignores harmlessly.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

import orjson

from txbroker.remoting.codes import FLAG_ONEWAY, RequestCode, ResponseCode
from txbroker.remoting.command import RemotingCommand
from txbroker.remoting.errors import Refusal
from txbroker.remoting.headers import (
    EndTransactionRequestHeader,
    ResumeCheckHalfMessageRequestHeader,
    TxnDecideRequestHeader,
    TxnListRequestHeader,
    TxnShowRequestHeader,
)
from txbroker.service.transaction.service import TransactionalMessageService
from txbroker.service.transaction.state import UnknownTransactionError

log = logging.getLogger(__name__)

Handler = Callable[[Any, RemotingCommand], Awaitable[RemotingCommand | None]]


def transaction_handlers(tx: TransactionalMessageService) -> dict[int, Handler]:
    """Request code → handler, for ``RemotingServer.register``."""

    async def end_transaction(conn: Any, cmd: RemotingCommand) -> RemotingCommand | None:
        try:
            if not tx.active:  # a slave (RocketMQ answers SLAVE_NOT_AVAILABLE too)
                raise Refusal(ResponseCode.SLAVE_NOT_AVAILABLE,
                              "this broker is not its group's master: END_TRANSACTION refused")
            h = EndTransactionRequestHeader.from_ext(cmd.ext_fields)
            await tx.end_transaction(
                commit_log_offset=h.commit_log_offset,
                tran_state_table_offset=h.tran_state_table_offset,
                producer_group=h.producer_group, commit_or_rollback=h.commit_or_rollback,
                from_check=h.from_transaction_check)
        except Refusal as exc:  # logged: a Java producer's END_TRANSACTION is never answered
            log.info("END_TRANSACTION from %s refused: %s (ext %s)", getattr(conn, "peer", "?"),
                     exc.remark, {k: v for k, v in cmd.ext_fields.items() if k != "Signature"})
            raise
        # A one-way END (every producer's) gets no answer: build none.
        return None if cmd.flag & FLAG_ONEWAY else cmd.response(ResponseCode.SUCCESS)

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
        if doc is None:
            raise UnknownTransactionError(h.id)
        return cmd.response(ResponseCode.SUCCESS, body=orjson.dumps(doc))

    async def txn_decide(conn: Any, cmd: RemotingCommand) -> RemotingCommand:
        h = TxnDecideRequestHeader.from_ext(cmd.ext_fields)
        doc = await tx.operator_decide(h.id, h.decision, operator=h.operator,
                                       peer=getattr(conn, "peer", ""), reason=h.reason)
        return cmd.response(ResponseCode.SUCCESS, body=orjson.dumps(doc))

    return {
        RequestCode.END_TRANSACTION: end_transaction,
        RequestCode.RESUME_CHECK_HALF_MESSAGE: resume_check,
        RequestCode.TXN_LIST: txn_list,
        RequestCode.TXN_SHOW: txn_show,
        RequestCode.TXN_DECIDE: txn_decide,
    }
