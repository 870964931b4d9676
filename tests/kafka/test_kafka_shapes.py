"""The one description of where partitions sit in each request (``shapes.py``), checked against
the wire schema: every field it names exists in every served version, with the type it
assumes, so authorization, routing and coordinator refusals cannot drift from the codec."""

from __future__ import annotations

import pytest

from txbroker.remoting.kafka.apis import SERVED, ApiKey
from txbroker.remoting.kafka.framing import decode_response, encode_response
from txbroker.remoting.kafka.schema import F, _in, fields
from txbroker.service.kafka.shapes import SHAPES


def _field(table: list[F], name: str, version: int) -> F:
    found = [f for f in table if f.name == name and _in(f.versions, version)]
    assert found, f"no field {name!r} in version {version}"
    return found[0]


@pytest.mark.parametrize("api", sorted(SHAPES), ids=lambda a: ApiKey(a).name)
def test_every_named_field_is_in_every_served_version(api: ApiKey) -> None:
    shape = SHAPES[api]
    lo, hi = SERVED[api]
    for version in range(lo, hi + 1):
        topics = _field(fields(api, True), shape.req_topics, version)
        assert isinstance(topics.type, list)
        _field(topics.type, shape.req_name, version)
        parts = _field(topics.type, shape.req_parts, version)
        if shape.req_index is None:
            assert parts.type == "[int32]"
        else:
            assert isinstance(parts.type, list)
            _field(parts.type, shape.req_index, version)
        answers = _field(fields(api, False), shape.resp_topics, version)
        assert isinstance(answers.type, list)
        _field(answers.type, shape.resp_name, version)
        answer_parts = _field(answers.type, shape.resp_parts, version)
        assert isinstance(answer_parts.type, list)
        for name in (shape.resp_index, shape.resp_error):
            _field(answer_parts.type, name, version)


@pytest.mark.parametrize("api", sorted(SHAPES), ids=lambda a: ApiKey(a).name)
def test_a_refusal_encodes_and_reads_back_in_every_served_version(api: ApiKey) -> None:
    shape = SHAPES[api]
    part = 7 if shape.req_index is None else {shape.req_index: 7}
    body = {shape.req_topics: [{shape.req_name: "orders", shape.req_parts: [part]}]}
    lo, hi = SERVED[api]
    for version in range(lo, hi + 1):
        frame = encode_response(api, version, 5, shape.refuse_all(body, 29))
        corr, answer = decode_response(api, version, frame[4:])
        assert corr == 5
        (topic,) = answer[shape.resp_topics]
        assert topic[shape.resp_name] == "orders"
        (refused,) = topic[shape.resp_parts]
        assert refused[shape.resp_index] == 7 and refused[shape.resp_error] == 29
