"""EndTransaction: a 5.x producer's commit or rollback, or its answer to a check-back.

The transaction id is the half's offsetMsgId (send.py), so the half is found by its commitlog
offset; the request's topic and message id must be the half's, or the request names another
transaction.  The decision then goes through the transaction service exactly as a remoting
END_TRANSACTION does, with the topic as the producer group (the half's PGROUP) and
``SOURCE_SERVER_CHECK`` as an answer to a check (counted as one, as ``fromTransactionCheck``
is).  ``SOURCE_UNSPECIFIED`` (older clients, rocketmq-clients#688) counts as the client's own.
Unlike the one-way remoting END, a 5.x EndTransaction is answered: a refusal reaches the
client with its reason.
"""

from __future__ import annotations

import logging

from txbroker.remoting.errors import Refusal
from txbroker.remoting.grpc import definition_pb2 as pb
from txbroker.remoting.grpc import service_pb2 as spb
from txbroker.service.grpc.status import Code, GrpcError, from_refusal, status
from txbroker.store.record import (
    PROPERTY_PRODUCER_GROUP,
    PROPERTY_REAL_TOPIC,
    PROPERTY_UNIQ_KEY,
    decode_offset_msg_id,
)

log = logging.getLogger(__name__)

#: 5.x resolution -> remoting commitOrRollback (TRANSACTION_COMMIT_TYPE / ROLLBACK_TYPE).
_COMMIT_OR_ROLLBACK = {pb.COMMIT: 8, pb.ROLLBACK: 12}


class TransactionHandlers:
    def __init__(self, tx) -> None:
        self.tx = tx

    async def end(self, request: spb.EndTransactionRequest) -> spb.EndTransactionResponse:
        commit_or_rollback = _COMMIT_OR_ROLLBACK.get(request.resolution)
        if commit_or_rollback is None:
            raise GrpcError(Code.BAD_REQUEST, "resolution must be COMMIT or ROLLBACK")
        if not self.tx.active:
            raise GrpcError(Code.HA_NOT_AVAILABLE,
                            "this broker is not its group's master: EndTransaction refused")
        try:
            _, _, phys = decode_offset_msg_id(request.transaction_id)
        except ValueError:
            raise GrpcError(Code.INVALID_TRANSACTION_ID,
                            f"transaction id {request.transaction_id!r} is not one this broker "
                            "gave out") from None
        group, queue_offset = self._half(phys, request)
        try:
            await self.tx.end_transaction(
                commit_log_offset=phys, tran_state_table_offset=queue_offset,
                producer_group=group, commit_or_rollback=commit_or_rollback,
                from_check=request.source == pb.SOURCE_SERVER_CHECK)
        except Refusal as exc:
            err = from_refusal(exc)
            log.info("gRPC EndTransaction %s refused: %s", request.transaction_id, err.message)
            raise err from None
        return spb.EndTransactionResponse(status=status())

    def _half(self, phys: int, request: spb.EndTransactionRequest) -> tuple[str, int]:
        """The half's producer group and queue offset, once its topic and message id are the
        request's."""
        entry = self.tx.entry(phys)
        if entry is not None:
            group, queue_offset, topic, uniq = entry.group, entry.queue_offset, entry.topic, entry.uniq
        else:
            half = self.tx.read_half(phys)
            if half is None:
                raise GrpcError(Code.INVALID_TRANSACTION_ID,
                                f"transaction {request.transaction_id} names no half message")
            props = half.properties
            group, queue_offset = props.get(PROPERTY_PRODUCER_GROUP, ""), half.queue_offset
            topic, uniq = props.get(PROPERTY_REAL_TOPIC, ""), props.get(PROPERTY_UNIQ_KEY)
        if topic != request.topic.name or (request.message_id and uniq
                                           and uniq != request.message_id):
            raise GrpcError(Code.INVALID_TRANSACTION_ID,
                            f"transaction {request.transaction_id} is not message "
                            f"{request.message_id} of topic {request.topic.name}")
        return group, queue_offset
