"""Timer messages on the wire and on disk (pure: no I/O, no clock of its own).

A producer asks for a delivery time with one of RocketMQ 5's properties (``MessageConst``):
``TIMER_DELAY_SEC`` or ``TIMER_DELAY_MS`` (relative to when the broker takes the message) or
``TIMER_DELIVER_MS`` (absolute, epoch milliseconds), read in that order of precedence as
RocketMQ's ``HookUtils.transformTimerMessage`` reads them.  :func:`deliver_at` resolves them;
:func:`wrap` turns the message into the record that waits in ``rmq_sys_wheel_timer`` queue 0
(the real topic and queue in ``REAL_TOPIC``/``REAL_QID``, the resolved time in
``TIMER_OUT_MS``, RocketMQ's layout) and :func:`unwrap` gives back the message to deliver.

The recall handle is RocketMQ 5.3's (:mod:`txbroker.remoting.recall`); a recall names the
timer by its UNIQ_KEY (or, without one, its record's offsetMsgId).
"""

from __future__ import annotations

import dataclasses

from txbroker.remoting.codes import ResponseCode
from txbroker.remoting.errors import Refusal
from txbroker.remoting.recall import RecallHandle
from txbroker.remoting.recall import decode_handle as _decode_handle
from txbroker.service.topics import TIMER_TOPIC
from txbroker.store.record import (
    PROPERTY_DELAY_TIME_LEVEL,
    PROPERTY_REAL_QUEUE_ID,
    PROPERTY_REAL_TOPIC,
    PROPERTY_TIMER_DELAY_MS,
    PROPERTY_TIMER_DELAY_SEC,
    PROPERTY_TIMER_DELIVER_MS,
    PROPERTY_TIMER_OUT_MS,
    Message,
    StoredMessage,
)

#: The queues of the timer topic: the timers, and the settle records naming finished ones.
TIMER_QUEUE = 0
SETTLE_QUEUE = 1
#: What a producer may set, in RocketMQ's order of precedence, with the factor to ms.
_REQUESTS = ((PROPERTY_TIMER_DELAY_SEC, 1000, True), (PROPERTY_TIMER_DELAY_MS, 1, True),
             (PROPERTY_TIMER_DELIVER_MS, 1, False))
_REQUEST_NAMES = tuple(name for name, _, _ in _REQUESTS)
_REQUEST_SET = frozenset(_REQUEST_NAMES)
#: Longest integer text accepted (an epoch in ms has 13 digits): no giant int parsing.
_MAX_DIGITS = 18


class TimerRefusal(Refusal):
    """A timer send or recall refused; the remark names the property or handle and why."""


def is_timer(props: dict[str, str]) -> bool:
    """The message asks for a delivery time (and no delay level, which wins, as in RocketMQ).
    Asked of every send: the common answer (no timer property) is one set operation."""
    if props.keys().isdisjoint(_REQUEST_SET):
        return False
    return props.get(PROPERTY_DELAY_TIME_LEVEL, "0") in ("", "0")


def strip_requests(props: dict[str, str]) -> None:
    """Drop the timer properties (a delay level wins over them, as in RocketMQ)."""
    for name in _REQUEST_NAMES:
        props.pop(name, None)


def deliver_at(props: dict[str, str], now_ms: int, max_delay_ms: int) -> int:
    """The delivery time (epoch ms) the properties ask for.

    A time already past means "deliver now" (the caller stores the message as it is); a value
    that is not a non-negative integer, or a time beyond ``now_ms + max_delay_ms``, is a
    :class:`TimerRefusal` naming the property (RocketMQ answers MESSAGE_ILLEGAL too)."""
    for name, factor, relative in _REQUESTS:
        raw = props.get(name)
        if raw is None:
            continue
        text = raw.strip()
        if not text.isascii() or not text.isdigit() or len(text) > _MAX_DIGITS:
            raise TimerRefusal(ResponseCode.MESSAGE_ILLEGAL,
                               f"timer message illegal: property {name}={raw!r} is not a "
                               "non-negative integer")
        value = int(text) * factor
        when = now_ms + value if relative else value
        if when - now_ms > max_delay_ms:
            raise TimerRefusal(ResponseCode.MESSAGE_ILLEGAL,
                               f"timer message illegal: property {name}={raw} asks for delivery "
                               f"{(when - now_ms) / 1000:.0f} s ahead, beyond the broker's "
                               f"timer_max_delay of {max_delay_ms / 1000:.0f} s")
        return when
    raise ValueError("not a timer message")  # callers ask is_timer() first


def wrap(msg: Message, when_ms: int) -> Message:
    """``msg`` as it waits in the timer queue until ``when_ms``.  Everything else is kept
    (a committed transaction's final message keeps its commit flag and half offset, which is
    how transaction recovery still finds the commit)."""
    props = dict(msg.properties)
    props[PROPERTY_REAL_TOPIC] = msg.topic
    props[PROPERTY_REAL_QUEUE_ID] = str(msg.queue_id)
    props[PROPERTY_TIMER_OUT_MS] = str(when_ms)
    return dataclasses.replace(msg, topic=TIMER_TOPIC, queue_id=TIMER_QUEUE, properties=props,
                               store_timestamp=0)


def out_ms(m: StoredMessage) -> int | None:
    """The delivery time of a stored timer record, None if it has none readable."""
    raw = m.properties.get(PROPERTY_TIMER_OUT_MS, "")
    return int(raw) if raw.isascii() and raw.isdigit() and len(raw) <= _MAX_DIGITS else None


def unwrap(m: StoredMessage) -> Message:
    """The message to deliver: real topic and queue back, the requests dropped (so it is not
    a timer again), ``TIMER_OUT_MS`` kept (when it was due: consumers can see lateness)."""
    props = dict(m.properties)
    topic = props.pop(PROPERTY_REAL_TOPIC, m.topic)
    raw_qid = props.pop(PROPERTY_REAL_QUEUE_ID, "0")
    strip_requests(props)
    return Message(topic=topic, queue_id=int(raw_qid) if raw_qid.isdigit() else 0, body=m.body,
                   flag=m.flag, properties=props, sys_flag=m.sys_flag,
                   born_timestamp=m.born_timestamp, born_host=m.born_host,
                   reconsume_times=m.reconsume_times,
                   prepared_transaction_offset=m.prepared_transaction_offset)


def again(m: StoredMessage) -> Message:
    """A pending timer written again at the head of the timer queue (a roll): same record,
    stamped now."""
    return Message(topic=m.topic, queue_id=m.queue_id, body=m.body, flag=m.flag,
                   properties=dict(m.properties), sys_flag=m.sys_flag,
                   born_timestamp=m.born_timestamp, born_host=m.born_host,
                   reconsume_times=m.reconsume_times,
                   prepared_transaction_offset=m.prepared_transaction_offset)


def decode_handle(handle: str) -> RecallHandle:
    """The handle's fields, or a :class:`TimerRefusal` (ILLEGAL_OPERATION, RocketMQ's code)."""
    try:
        return _decode_handle(handle)
    except ValueError as exc:
        raise TimerRefusal(ResponseCode.ILLEGAL_OPERATION, f"recall failed: {exc}") from None
