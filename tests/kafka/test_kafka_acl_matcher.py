"""Kafka's authorizer decision (service/kafka/acls.py) as a table, no I/O: patterns, the
wildcard, principals, hosts, implied operations, DENY over ALLOW, roles and super users; the
bindings in the users file and the checks a binding must pass."""

from __future__ import annotations

import pytest

from txbroker.service.kafka.acls import (
    AclBinding,
    AclFilter,
    AclOperation,
    AclPermission,
    Authorizer,
    InvalidAcl,
    PatternType,
    ResourceType,
    acl_filter,
    binding,
    check_binding,
)
from txbroker.service.users import Users, decode_users, encode_users

T, G, X, C = (ResourceType.TOPIC, ResourceType.GROUP, ResourceType.TRANSACTIONAL_ID,
              ResourceType.CLUSTER)
LIT, PRE = PatternType.LITERAL, PatternType.PREFIXED
Op = AclOperation
ALLOW, DENY = AclPermission.ALLOW, AclPermission.DENY


def b(kind, name, op, perm=ALLOW, who="User:bob", host="*", pattern=LIT) -> AclBinding:
    return AclBinding(kind, name, pattern, who, host, op, perm)


# (bindings, principal, host, operation, resource type, name, allowed?)
TABLE = [
    ([], "User:bob", "10.0.0.1", Op.READ, T, "t", False),  # no ACL: denied
    ([b(T, "t", Op.READ)], "User:bob", "10.0.0.1", Op.READ, T, "t", True),
    ([b(T, "t", Op.READ)], "User:bob", "10.0.0.1", Op.READ, T, "t2", False),
    ([b(T, "t", Op.READ)], "User:bob", "10.0.0.1", Op.WRITE, T, "t", False),
    ([b(T, "t", Op.READ)], "User:eve", "10.0.0.1", Op.READ, T, "t", False),
    ([b(T, "t", Op.READ)], "User:bob", "10.0.0.1", Op.READ, G, "t", False),  # other type
    ([b(T, "*", Op.READ)], "User:bob", "10.0.0.1", Op.READ, T, "anything", True),
    ([b(T, "or", Op.WRITE, pattern=PRE)], "User:bob", "h", Op.WRITE, T, "orders", True),
    ([b(T, "or", Op.WRITE, pattern=PRE)], "User:bob", "h", Op.WRITE, T, "o", False),
    ([b(T, "*", Op.WRITE, pattern=PRE)], "User:bob", "h", Op.WRITE, T, "orders", False),
    ([b(T, "t", Op.READ, who="User:*")], "User:eve", "h", Op.READ, T, "t", True),
    ([b(T, "t", Op.READ, host="10.0.0.1")], "User:bob", "10.0.0.1", Op.READ, T, "t", True),
    ([b(T, "t", Op.READ, host="10.0.0.1")], "User:bob", "10.0.0.2", Op.READ, T, "t", False),
    ([b(T, "t", Op.ALL)], "User:bob", "h", Op.DELETE, T, "t", True),
    # DESCRIBE implied by READ, WRITE, DELETE, ALTER; DESCRIBE_CONFIGS by ALTER_CONFIGS
    ([b(T, "t", Op.READ)], "User:bob", "h", Op.DESCRIBE, T, "t", True),
    ([b(T, "t", Op.WRITE)], "User:bob", "h", Op.DESCRIBE, T, "t", True),
    ([b(T, "t", Op.DELETE)], "User:bob", "h", Op.DESCRIBE, T, "t", True),
    ([b(T, "t", Op.ALTER)], "User:bob", "h", Op.DESCRIBE, T, "t", True),
    ([b(T, "t", Op.CREATE)], "User:bob", "h", Op.DESCRIBE, T, "t", False),
    ([b(T, "t", Op.DESCRIBE)], "User:bob", "h", Op.READ, T, "t", False),  # not the reverse
    ([b(T, "t", Op.ALTER_CONFIGS)], "User:bob", "h", Op.DESCRIBE_CONFIGS, T, "t", True),
    ([b(T, "t", Op.ALTER_CONFIGS)], "User:bob", "h", Op.DESCRIBE, T, "t", False),
    # DENY wins, whatever the pattern that allows
    ([b(T, "*", Op.ALL), b(T, "t", Op.WRITE, DENY)], "User:bob", "h", Op.WRITE, T, "t", False),
    ([b(T, "*", Op.ALL), b(T, "t", Op.WRITE, DENY)], "User:bob", "h", Op.READ, T, "t", True),
    ([b(T, "t", Op.READ), b(T, "t", Op.ALL, DENY, who="User:*")], "User:bob", "h", Op.READ, T,
     "t", False),
    ([b(T, "t", Op.READ), b(T, "t", Op.READ, DENY, host="10.9.9.9")], "User:bob", "10.0.0.1",
     Op.READ, T, "t", True),
    # a DENY on READ does not deny the DESCRIBE that a WRITE implies (Kafka: exact operation)
    ([b(T, "t", Op.WRITE), b(T, "t", Op.READ, DENY)], "User:bob", "h", Op.DESCRIBE, T, "t",
     True),
    ([b(C, "kafka-cluster", Op.IDEMPOTENT_WRITE)], "User:bob", "h", Op.IDEMPOTENT_WRITE, C,
     "kafka-cluster", True),
]


@pytest.mark.parametrize("bindings, principal, host, op, kind, name, expected", TABLE)
def test_decision_table(bindings, principal, host, op, kind, name, expected) -> None:
    assert Authorizer(bindings).allowed(principal, host, op, kind, name) is expected


def test_super_users_are_allowed_everything_even_denied() -> None:
    auth = Authorizer([b(T, "*", Op.ALL, DENY, who="User:root")], super_users=["root"])
    assert auth.allowed("User:root", "h", Op.DELETE, T, "t")
    assert not auth.allowed("User:bob", "h", Op.DELETE, T, "t")


ROLES = [
    # role, operation, type, name, allowed?
    ("producer", Op.WRITE, T, "t", True), ("producer", Op.CREATE, T, "t", True),
    ("producer", Op.DESCRIBE, T, "t", True), ("producer", Op.READ, T, "t", False),
    ("producer", Op.WRITE, X, "tx", True), ("producer", Op.DESCRIBE, X, "tx", True),
    ("producer", Op.IDEMPOTENT_WRITE, C, "kafka-cluster", True),
    ("producer", Op.READ, G, "g", False), ("producer", Op.ALTER, C, "kafka-cluster", False),
    ("consumer", Op.READ, T, "t", True), ("consumer", Op.DESCRIBE, T, "t", True),
    ("consumer", Op.READ, G, "g", True), ("consumer", Op.DESCRIBE, G, "g", True),
    ("consumer", Op.WRITE, T, "t", False), ("consumer", Op.DELETE, G, "g", False),
    ("consumer", Op.WRITE, X, "tx", False),
    ("admin", Op.ALTER, C, "kafka-cluster", True), ("admin", Op.DELETE, T, "t", True),
]


@pytest.mark.parametrize("role, op, kind, name, expected", ROLES)
def test_roles_of_the_user_store(role, op, kind, name, expected) -> None:
    users = Users().with_password("bob", "pw", (role,))
    assert users.authorizer.allowed("User:bob", "h", op, kind, name) is expected
    assert not users.authorizer.allowed("User:eve", "h", op, kind, name)


def test_a_deny_binding_narrows_a_role_but_not_admin() -> None:
    users = Users().with_password("bob", "pw", ("producer",)).with_password(
        "root", "pw", ("admin",)).with_acls([b(T, "secret", Op.WRITE, DENY, who="User:*")])
    assert not users.authorizer.allowed("User:bob", "h", Op.WRITE, T, "secret")
    assert users.authorizer.allowed("User:bob", "h", Op.WRITE, T, "public")
    assert users.authorizer.allowed("User:root", "h", Op.WRITE, T, "secret")


def test_idempotent_producers_write_on_some_topic() -> None:
    lit = Authorizer([b(T, "t", Op.WRITE)])
    assert lit.allowed_any("User:bob", "h", Op.WRITE, T)
    assert not lit.allowed_any("User:eve", "h", Op.WRITE, T)
    denied = Authorizer([b(T, "t", Op.WRITE), b(T, "*", Op.WRITE, DENY)])
    assert not denied.allowed_any("User:bob", "h", Op.WRITE, T)
    assert not Authorizer([b(T, "t", Op.READ)]).allowed_any("User:bob", "h", Op.WRITE, T)


FILTERS = [
    (AclFilter(), True),
    (AclFilter(T, "orders"), False),  # ANY pattern: the exact name only
    (AclFilter(T, "ord"), True),
    (AclFilter(T, "orders", PatternType.MATCH), True),  # what applies to "orders"
    (AclFilter(T, "other", PatternType.MATCH), False),
    (AclFilter(T, None, LIT), False),
    (AclFilter(T, None, PRE), True),
    (AclFilter(G), False),
    (AclFilter(principal="User:bob", operation=Op.WRITE), True),
    (AclFilter(principal="User:eve"), False),
    (AclFilter(permission=DENY), False),
]


@pytest.mark.parametrize("selected, expected", FILTERS)
def test_filters(selected: AclFilter, expected: bool) -> None:
    assert selected.matches(b(T, "ord", Op.WRITE, pattern=PRE)) is expected


@pytest.mark.parametrize("args, fragment", [
    ((1, "t", 3, "User:bob", "*", 3, 3), "not a concrete type"),  # ANY
    ((9, "t", 3, "User:bob", "*", 3, 3), "9 is not a valid ResourceType"),
    ((2, "t", 2, "User:bob", "*", 3, 3), "LITERAL or PREFIXED"),  # MATCH
    ((2, "", 3, "User:bob", "*", 3, 3), "empty"),
    ((4, "other", 3, "User:bob", "*", 7, 3), "kafka-cluster"),
    ((2, "t", 3, "bob", "*", 3, 3), "User:<name>"),
    ((2, "t", 3, "Group:x", "*", 3, 3), "User:<name>"),
    ((2, "t", 3, "User:bob", "", 3, 3), "host"),
    ((2, "t", 3, "User:bob", "*", 1, 3), "not concrete"),
    ((2, "t", 3, "User:bob", "*", 3, 1), "ALLOW or DENY"),
])
def test_bindings_that_cannot_be_stored(args, fragment: str) -> None:
    with pytest.raises(InvalidAcl, match=fragment):
        binding(*args)


def test_a_filter_with_unknown_fields_is_invalid() -> None:
    with pytest.raises(InvalidAcl):
        acl_filter(0, None, 1, None, None, 1, 1)
    assert acl_filter(1, None, 1, None, None, 1, 1) == AclFilter()


def test_bindings_in_the_users_file_round_trip_and_version() -> None:
    plain = Users().with_password("bob", "pw")
    assert b'"version": 1' in encode_users(plain)  # no bindings: readable by older brokers
    with_acls = plain.with_acls([b(T, "t", Op.READ), b(T, "t", Op.READ),
                                 b(G, "g", Op.READ, pattern=PRE)])
    assert len(with_acls.acls) == 2  # the same binding once
    data = encode_users(with_acls)
    assert b'"version": 2' in data
    again = decode_users(data)
    assert again.acls == with_acls.acls and set(again.users) == {"bob"}
    kept, gone = again.without_acls(AclFilter(G))
    assert gone == [b(G, "g", Op.READ, pattern=PRE)] and kept.acls == (b(T, "t", Op.READ),)


@pytest.mark.parametrize("acls, fragment", [
    (b'"x"', '"acls" must be a list'),
    (b'[{"resource_type": "TOPIC"}]', "acls[0]: must be an object"),
    ((b'[{"resource_type": "TOPIK", "name": "t", "pattern": "LITERAL", "principal": "User:a", '
      b'"host": "*", "operation": "READ", "permission": "ALLOW"}]'), "resource_type 'TOPIK'"),
    ((b'[{"resource_type": "TOPIC", "name": "t", "pattern": "LITERAL", "principal": "a", '
      b'"host": "*", "operation": "READ", "permission": "ALLOW"}]'), "User:<name>"),
])
def test_bad_bindings_in_the_file_are_named(acls: bytes, fragment: str) -> None:
    with pytest.raises((ValueError, TypeError), match=fragment.replace("[", r"\[").replace("]", r"\]")):
        decode_users(b'{"version": 2, "users": {}, "acls": ' + acls + b"}")


def test_check_binding_passes_a_good_one() -> None:
    good = b(C, "kafka-cluster", Op.ALTER)
    assert check_binding(good) is good
