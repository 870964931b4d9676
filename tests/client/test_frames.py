"""Frame templates (txbroker/client/frames.py): the bytes the generic encoder would write.

For random values of every field that varies per request (and of the ones fixed per
template: group, topic, flags), a filled template's frame must equal
``codec.encode`` of the same request built from the header classes, byte for byte; and the
frame must decode to the fields that went in.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from txbroker.client.frames import FrameTemplate
from txbroker.client.message import Message
from txbroker.client.producer import SEND_HOLES, SEND_INT_HOLES, Producer
from txbroker.client.pull import PULL_HOLES
from txbroker.client.rebalance import MessageQueue
from txbroker.client.transaction import END_HOLES, END_INT_HOLES
from txbroker.remoting.codec import SEPARATE_BODY_FROM, FrameDecoder, encode
from txbroker.remoting.codes import FLAG_ONEWAY, RequestCode
from txbroker.remoting.command import RemotingCommand
from txbroker.remoting.headers import (
    EndTransactionRequestHeader,
    PullMessageRequestHeader,
    SendMessageRequestHeader,
)
from txbroker.store import record as rec

names = st.text(st.sampled_from("abcXYZ09_-%|"), min_size=1, max_size=40)
# Any text at all: control characters, quotes, backslashes, non-BMP characters.
texts = st.text(max_size=200)
opaques = st.integers(0, 0x7FFFFFFF)
bodies = st.one_of(st.binary(max_size=300), st.binary(min_size=SEPARATE_BODY_FROM,
                                                      max_size=SEPARATE_BODY_FROM + 10))


def _wire(parts: list[bytes]) -> bytes:
    return b"".join(parts)


@settings(max_examples=300, deadline=None)
@given(group=names, topic=names, sys_flag=st.sampled_from([0, 1, 4, 5]), batch=st.booleans(),
       oneway=st.booleans(), queue_id=st.integers(-1, 2**31 - 1),
       born=st.integers(0, 2**63 - 1), properties=texts, opaque=opaques, body=bodies)
def test_send_template_writes_the_generic_encoders_bytes(group, topic, sys_flag, batch, oneway,
                                                         queue_id, born, properties, opaque, body):
    header = SendMessageRequestHeader(
        producer_group=group, topic=topic, default_topic="TBW102", default_topic_queue_nums=4,
        queue_id=queue_id, sys_flag=sys_flag, born_timestamp=born, flag=0, properties=properties,
        reconsume_times=0, unit_mode=False, batch=batch)
    code = RequestCode.SEND_BATCH_MESSAGE if batch else RequestCode.SEND_MESSAGE_V2
    generic = RemotingCommand(int(code), opaque, FLAG_ONEWAY if oneway else 0,
                              ext_fields=header.to_ext_v2(), body=body)
    template = FrameTemplate(code, header.to_ext_v2(), SEND_HOLES, ints=SEND_INT_HOLES,
                             oneway=oneway)
    values = (queue_id, born, properties)
    assert _wire(template.frame(opaque, values, body)) == encode(generic)
    (decoded,) = FrameDecoder().feed(_wire(template.fill(values, body).frame(opaque)))
    assert decoded.opaque == opaque and decoded.body == body
    assert SendMessageRequestHeader.from_ext_v2(decoded.ext_fields) == header
    command = template.command(values, body)  # what a signing connection encodes instead
    command.opaque = opaque
    assert encode(command) == encode(generic)


@settings(max_examples=300, deadline=None)
@given(group=names, from_check=st.booleans(), queue_offset=st.integers(0, 2**63 - 1),
       commit_log_offset=st.integers(0, 2**63 - 1), state=st.sampled_from([0, 8, 12]),
       msg_id=texts.filter(bool), opaque=opaques)
def test_end_template_writes_the_generic_encoders_bytes(group, from_check, queue_offset,
                                                        commit_log_offset, state, msg_id, opaque):
    header = EndTransactionRequestHeader(
        producer_group=group, tran_state_table_offset=queue_offset,
        commit_log_offset=commit_log_offset, commit_or_rollback=state,
        from_transaction_check=from_check, msg_id=msg_id, transaction_id=msg_id)
    generic = RemotingCommand(int(RequestCode.END_TRANSACTION), opaque, FLAG_ONEWAY,
                              ext_fields=header.to_ext())
    blank = EndTransactionRequestHeader(
        producer_group=group, tran_state_table_offset=0, commit_log_offset=0,
        commit_or_rollback=0, from_transaction_check=from_check, msg_id="-", transaction_id="-")
    template = FrameTemplate(RequestCode.END_TRANSACTION, blank.to_ext(), END_HOLES,
                             ints=END_INT_HOLES, oneway=True)
    values = (queue_offset, commit_log_offset, state, msg_id, msg_id)
    assert _wire(template.frame(opaque, values, b"")) == encode(generic)


def test_a_producers_send_is_the_generic_encoders_frame():
    """The producer's own request for a message, against the header class's encoding."""
    producer = Producer("PG_FRAMES")
    mq = MessageQueue("FramesTopic", "broker-a", 3)
    props = rec.properties_to_string({"TAGS": "t", "UNIQ_KEY": "0A" * 16, "WAIT": "true"})
    req = producer._request(mq, b"body", props, 4, batch=False)
    queue_id, born, properties = req.values
    assert (queue_id, properties) == (3, "TAGS\x01t\x02UNIQ_KEY\x01" + "0A" * 16 + "\x02WAIT\x01true")
    header = SendMessageRequestHeader(
        producer_group="PG_FRAMES", topic="FramesTopic", default_topic="TBW102",
        default_topic_queue_nums=4, queue_id=3, sys_flag=4, born_timestamp=int(born), flag=0,
        properties=properties, reconsume_times=0, unit_mode=False, batch=False)
    generic = RemotingCommand(int(RequestCode.SEND_MESSAGE_V2), 77, ext_fields=header.to_ext_v2(),
                              body=b"body")
    assert _wire(req.frame(77)) == encode(generic)


def test_a_hole_that_is_no_field_is_refused():
    with pytest.raises(ValueError, match="'zz'"):
        FrameTemplate(RequestCode.SEND_MESSAGE_V2, {"a": "x"}, ("zz",))


def test_holes_out_of_the_headers_order_are_refused():
    with pytest.raises(ValueError, match="key order"):
        FrameTemplate(RequestCode.SEND_MESSAGE_V2, {"a": "x", "b": "y"}, ("b", "a"))


def test_a_percent_sign_in_a_fixed_field_stays_as_it_is():
    """The template is a bytes format: a group or topic with '%' (a retry topic) is escaped."""
    ext = {"a": "%RETRY%g", "b": "%d%b%%", "e": "0"}
    template = FrameTemplate(RequestCode.SEND_MESSAGE_V2, ext, ("e",), ints=frozenset({"e"}))
    generic = RemotingCommand(int(RequestCode.SEND_MESSAGE_V2), 5, ext_fields={**ext, "e": "7"})
    assert _wire(template.frame(5, (7,), b"")) == encode(generic)


#: Text that fits in a properties string (no \x01 / \x02) and is non-empty, no spaces (keys).
words = st.text(st.characters(blacklist_characters="\x01\x02 "), min_size=1, max_size=12)
#: A tag expression's separator is no tag (Message.validate refuses it).
tag_words = words.filter(lambda w: "||" not in w)


@settings(max_examples=300, deadline=None)
@given(tags=st.none() | tag_words, keys=st.none() | words | st.lists(words, max_size=3),
       properties=st.none() | st.dictionaries(words.map(lambda w: "u" + w), words, max_size=4),
       delay=st.integers(0, 18), uniq=words, extra=st.sampled_from(["", "\x02TRAN_MSG\x01true"]))
def test_properties_text_is_the_joined_properties_map(tags, keys, properties, delay, uniq, extra):
    """A send's properties string is built without the map; it must be the map's string."""
    msg = Message("T", b"body", tags=tags, keys=keys, properties=properties, delay_level=delay)
    msg.validate()
    assert msg.wire_properties_text(uniq, extra) == \
        rec.properties_to_string(msg.wire_properties(uniq)) + extra


@settings(max_examples=200, deadline=None)
@given(group=names, topic=names, queue_id=st.integers(0, 1023), batch=st.integers(1, 1024),
       suspend=st.integers(0, 2**40), subscription=texts, version=st.integers(0, 2**62),
       offset=st.integers(0, 2**63 - 1), flag=st.integers(0, 31),
       commit=st.integers(-1, 2**63 - 1), opaque=opaques)
def test_pull_template_writes_the_generic_encoders_bytes(group, topic, queue_id, batch, suspend,
                                                         subscription, version, offset, flag,
                                                         commit, opaque):
    def header(queue_offset: int, sys_flag: int, commit_offset: int) -> PullMessageRequestHeader:
        return PullMessageRequestHeader(
            consumer_group=group, topic=topic, queue_id=queue_id, queue_offset=queue_offset,
            max_msg_nums=batch, sys_flag=sys_flag, commit_offset=commit_offset,
            suspend_timeout_millis=suspend, subscription=subscription, sub_version=version,
            expression_type="TAG")

    template = FrameTemplate(RequestCode.PULL_MESSAGE, header(0, 0, -1).to_ext(), PULL_HOLES,
                             ints=frozenset(PULL_HOLES))
    generic = RemotingCommand(int(RequestCode.PULL_MESSAGE), opaque,
                              ext_fields=header(offset, flag, commit).to_ext())
    assert _wire(template.fill((offset, flag, commit)).frame(opaque)) == encode(generic)


async def test_filled_requests_through_a_connection_wrap_their_opaques(broker) -> None:
    """An encoded request takes the connection's next opaque and wraps past the last one
    as a command does; each answer still finds its request."""
    import itertools

    from txbroker.remoting.client import RemotingClient
    from txbroker.remoting.codes import ResponseCode

    client = RemotingClient(broker.broker_addr)
    try:
        await client.connect()
        proto = client._proto
        last = proto.OPAQUE_LAST
        proto._opaques = itertools.count(last)
        template = FrameTemplate(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "-"}, ("topic",))
        first = await client.invoke(template.fill(("TBW102",)), 5.0)
        second = await client.invoke(template.fill(("TBW102",)), 5.0)
        assert (first.opaque, second.opaque) == (last, proto.OPAQUE_FIRST)
        assert first.code == second.code == ResponseCode.SUCCESS
    finally:
        await client.close()
