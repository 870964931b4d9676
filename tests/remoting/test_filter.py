"""The one tag-expression parser, checked against RocketMQ's FilterAPI.buildSubscriptionData.

Each row is what a Java client (and a Java broker parsing a PULL's ``subscription``) makes of
the expression: ``subString`` (``*`` = every message) and ``tagsSet``; an expression Java's
``split`` leaves no part of is an error.
"""

from __future__ import annotations

import pytest

from txbroker.remoting.codes import ResponseCode
from txbroker.remoting.filter import (
    SUB_ALL,
    SubscriptionParseError,
    TagExpression,
    parse_tag_expression,
)
from txbroker.remoting.headers import HeaderError

TABLE = [
    # expression, sub_string, tags
    (None, SUB_ALL, set()),
    ("", SUB_ALL, set()),
    ("*", SUB_ALL, set()),
    (" * ", " * ", {"*"}),            # not trimmed before the "*" test: the tag "*"
    ("A || *", "A || *", {"A", "*"}),  # "*" among tags is a tag, not "every message"
    ("TagA", "TagA", {"TagA"}),
    ("A || B", "A || B", {"A", "B"}),
    ("A||B", "A||B", {"A", "B"}),
    ("  A  ||  B  ", "  A  ||  B  ", {"A", "B"}),
    ("A||B||A", "A||B||A", {"A", "B"}),      # duplicates collapse
    ("A || ", "A || ", {"A"}),               # an empty part is skipped
    ("A||", "A||", {"A"}),
    ("||A", "||A", {"A"}),
    ("A|||B", "A|||B", {"A", "|B"}),         # split on the first "||"
    ("A | B", "A | B", {"A | B"}),           # one "|" does not split
    (" ", " ", set()),                       # blanks: no tag, so nothing matches
    (" || ", " || ", set()),
    ("\tA\n", "\tA\n", {"A"}),               # Java's trim: every character up to U+0020
    ("\u00a0A", "\u00a0A", {"\u00a0A"}),     # ... and nothing above it
]


@pytest.mark.parametrize("expression,sub_string,tags", TABLE)
def test_expression_table(expression, sub_string, tags) -> None:
    parsed = parse_tag_expression(expression)
    assert parsed == TagExpression(sub_string, frozenset(tags))
    assert parsed.matches_all == (sub_string == SUB_ALL)


@pytest.mark.parametrize("expression", ["||", "||||"])
def test_expression_without_parts_is_a_parse_failure(expression) -> None:
    with pytest.raises(SubscriptionParseError) as err:
        parse_tag_expression(expression)
    assert isinstance(err.value, HeaderError)
    assert err.value.code == ResponseCode.SUBSCRIPTION_PARSE_FAILED
    assert repr(expression) in err.value.remark


def test_non_string_is_refused() -> None:
    with pytest.raises(TypeError):
        parse_tag_expression(5)  # type: ignore[arg-type]


@pytest.mark.parametrize("expression,tag,matched", [
    ("*", "A", True), ("*", None, True),
    ("A || B", "A", True), ("A || B", "C", False), ("A || B", None, False),
    ("A || *", "C", False), ("A || *", "*", True),
    (" ", "A", False), (" ", None, False),
])
def test_matches(expression, tag, matched) -> None:
    assert parse_tag_expression(expression).matches(tag) is matched
