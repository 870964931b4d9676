"""Tag expressions ("*", "TagA || TagB"): the one parser the SDK and the broker share.

A consumer names the tags it wants in a subscription expression; the broker filters a queue by
the hashes of those tags (a PULL's ``subscription`` header, or the heartbeat's ``subString``)
and the consumer re-checks the tag strings, because hashes collide.  Both sides must read an
expression the same way or a message is filtered by one and expected by the other, so this
module is RocketMQ's ``FilterAPI.buildSubscriptionData`` (docs/protocol.md §4.5), rule for rule:

* ``None``, ``""`` and exactly ``"*"`` select every message (``SUB_ALL``); nothing is trimmed
  first, so ``" * "`` is the one tag ``*``;
* anything else is split on ``||``, with Java's ``String.split`` dropping trailing empty parts;
  an expression with no part left (``"||"``, ``"||||"``) is an error (the broker answers
  SUBSCRIPTION_PARSE_FAILED);
* each part is trimmed as Java's ``String.trim`` does (characters up to U+0020) and empty parts
  are skipped, duplicates collapse: ``"A || B ||"`` is {A, B}, ``"A || *"`` is {A, *};
* an expression that is not ``SUB_ALL`` selects only messages whose tag is in the set, so one
  made of blanks (``" "``, ``" || "``) selects nothing, and a message without a tag matches
  only ``SUB_ALL``.
"""

from __future__ import annotations

from dataclasses import dataclass

from txbroker.remoting.codes import ResponseCode
from txbroker.remoting.headers import HeaderError

#: The expression that selects every message (SubscriptionData.SUB_ALL).
SUB_ALL = "*"

#: What Java's ``String.trim`` removes from both ends: every character up to the space.
_JAVA_TRIM = "".join(map(chr, range(0x21)))


class SubscriptionParseError(HeaderError):
    """An expression FilterAPI cannot split; answered with SUBSCRIPTION_PARSE_FAILED."""

    def __init__(self, expression: str) -> None:
        super().__init__(ResponseCode.SUBSCRIPTION_PARSE_FAILED,
                         f"subscription expression {expression!r} has no tag (split error)")
        self.expression = expression


@dataclass(frozen=True, slots=True)
class TagExpression:
    """A parsed expression: RocketMQ's ``subString`` and ``tagsSet``."""

    #: The expression as RocketMQ keeps it: ``SUB_ALL`` for None/empty/"*", else as given.
    sub_string: str = SUB_ALL
    tags: frozenset[str] = frozenset()

    @property
    def matches_all(self) -> bool:
        return self.sub_string == SUB_ALL

    def matches(self, tag: str | None) -> bool:
        """Whether a message whose TAGS property is ``tag`` (None: no tag) is selected."""
        return self.matches_all or (tag is not None and tag in self.tags)


#: The parse of None, "" and "*".
MATCH_ALL = TagExpression()


def parse_tag_expression(expression: str | None) -> TagExpression:
    """Parse ``expression`` as FilterAPI.buildSubscriptionData does (rules in the module
    docstring); raises :class:`SubscriptionParseError` for an expression without parts and
    TypeError for a non-string."""
    if expression is None:
        return MATCH_ALL
    if not isinstance(expression, str):
        raise TypeError(f"a subscription expression must be a string, not {type(expression).__name__}")
    if not expression or expression == SUB_ALL:
        return MATCH_ALL
    parts = expression.split("||")
    while parts and not parts[-1]:
        parts.pop()
    if not parts:
        raise SubscriptionParseError(expression)
    tags = frozenset(tag for tag in (part.strip(_JAVA_TRIM) for part in parts) if tag)
    return TagExpression(expression, tags)
