"""The messages a transaction stores besides op records, built from what the producer sent
or from the stored half (pure: no I/O, no clock).

* the **half** (:func:`half_message`), stored like RocketMQ 4.x stores it: topic rewritten
  to ``RMQ_SYS_TRANS_HALF_TOPIC`` queue 0, the real topic and queue kept in ``REAL_TOPIC`` /
  ``REAL_QID``, the transaction bits of the sys flag reset so the half queue indexes it;
* the **final** message of a commit (:func:`final_message`): real topic and queue back,
  transaction markers removed, ``preparedTransactionOffset`` = the half's commitlog offset
  (what lets recovery find a commit whose op record a crash prevented);
* the **discard copy** (:func:`discard_copy`) in TRANS_CHECK_MAX_TIME_TOPIC, as RocketMQ
  copies a half it gave up checking.
"""

from __future__ import annotations

from txbroker.remoting.codes import ResponseCode
from txbroker.service.transaction.oplog import is_uint
from txbroker.service.transaction.state import TransactionError
from txbroker.store.record import (
    CHECK_MAX_TIME_TOPIC,
    HALF_TOPIC,
    PROPERTY_CHECK_IMMUNITY_TIME_IN_SECONDS,
    PROPERTY_DELAY_TIME_LEVEL,
    PROPERTY_PRODUCER_GROUP,
    PROPERTY_REAL_QUEUE_ID,
    PROPERTY_REAL_TOPIC,
    PROPERTY_TRANSACTION_CHECK_TIMES,
    PROPERTY_TRANSACTION_ID,
    PROPERTY_TRANSACTION_PREPARED,
    PROPERTY_TRANSACTION_PREPARED_QUEUE_OFFSET,
    PROPERTY_UNIQ_KEY,
    TRANSACTION_COMMIT_TYPE,
    TRANSACTION_MASK,
    Message,
)


def producer_group(msg: Message) -> str:
    """The half's producer group, after refusing what cannot be a transactional message
    (no PGROUP, a delay level, an ill-formed immunity)."""
    props = msg.properties
    group = props.get(PROPERTY_PRODUCER_GROUP, "")
    if not group:
        raise TransactionError(ResponseCode.MESSAGE_ILLEGAL,
                               "a transactional message needs the PGROUP property")
    delay = props.get(PROPERTY_DELAY_TIME_LEVEL)
    if delay not in (None, "", "0"):
        raise TransactionError(ResponseCode.MESSAGE_ILLEGAL,
                               f"a transactional message cannot have a delay level (DELAY={delay})")
    immunity = props.get(PROPERTY_CHECK_IMMUNITY_TIME_IN_SECONDS)
    if immunity is not None and not is_uint(immunity.strip()):
        raise TransactionError(ResponseCode.MESSAGE_ILLEGAL,
                               f"property CHECK_IMMUNITY_TIME_IN_SECONDS={immunity!r} is not a "
                               "non-negative integer")
    return group


def half_message(msg: Message) -> Message:
    """``msg`` as it is stored in the half queue."""
    props = dict(msg.properties)
    props[PROPERTY_REAL_TOPIC] = msg.topic
    props[PROPERTY_REAL_QUEUE_ID] = str(msg.queue_id)
    return Message(topic=HALF_TOPIC, queue_id=0, body=msg.body, flag=msg.flag,
                   properties=props, sys_flag=msg.sys_flag & ~TRANSACTION_MASK,
                   born_timestamp=msg.born_timestamp, born_host=msg.born_host,
                   reconsume_times=msg.reconsume_times)


def final_message(half: Message, phys: int, store_ts: int) -> Message:
    """The committed message: real topic and queue back, transaction markers removed.

    ``half`` is the half as stored at ``phys`` with store timestamp ``store_ts`` (read
    back, or the cached object that was put there).  Empty names and values are dropped,
    as reading a record back drops them (RocketMQ's decoder does the same)."""
    props = {k: v for k, v in half.properties.items() if k and v}
    topic = props.pop(PROPERTY_REAL_TOPIC, "")
    qid = props.pop(PROPERTY_REAL_QUEUE_ID, "0")
    if not topic:
        raise TransactionError(ResponseCode.SYSTEM_ERROR,
                               f"half message {phys} has no REAL_TOPIC")
    props.pop(PROPERTY_TRANSACTION_PREPARED, None)
    uniq = props.get(PROPERTY_UNIQ_KEY)
    if uniq:
        props.setdefault(PROPERTY_TRANSACTION_ID, uniq)
    return Message(topic=topic, queue_id=int(qid) if is_uint(qid) else 0, body=half.body,
                   flag=half.flag, properties=props,
                   sys_flag=(half.sys_flag & ~TRANSACTION_MASK) | TRANSACTION_COMMIT_TYPE,
                   born_timestamp=half.born_timestamp, born_host=half.born_host,
                   reconsume_times=half.reconsume_times,
                   prepared_transaction_offset=phys, store_timestamp=store_ts)


def discard_copy(half: Message, checks: int, queue_offset: int) -> Message:
    """The copy of a half checked ``checks`` times without an answer."""
    props = dict(half.properties)
    props[PROPERTY_TRANSACTION_CHECK_TIMES] = str(checks)
    props[PROPERTY_TRANSACTION_PREPARED_QUEUE_OFFSET] = str(queue_offset)
    return Message(topic=CHECK_MAX_TIME_TOPIC, queue_id=0, body=half.body, flag=half.flag,
                   properties=props, sys_flag=half.sys_flag,
                   born_timestamp=half.born_timestamp, born_host=half.born_host,
                   reconsume_times=half.reconsume_times)
