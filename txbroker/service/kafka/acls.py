"""Kafka's authorizer model, sans-IO: ACL bindings, filters and the allow/deny decision
(docs/security.md, "Kafka ACLs").

The numbers of :class:`ResourceType`, :class:`PatternType`, :class:`AclOperation` and
:class:`AclPermission` are Kafka's own (they travel in DescribeAcls / CreateAcls / DeleteAcls);
the decision is the one of Kafka's ``StandardAuthorizer`` with
``allow.everyone.if.no.acl.found=false``:

* a binding applies to a resource when its pattern does: LITERAL names it exactly or is the
  ``*`` wildcard, PREFIXED is a prefix of its name; to a request when its principal is the
  client's (or ``User:*``) and its host is the client's address (or ``*``);
* any applying DENY on the operation (or ALL) refuses, whatever allows it: DENY wins;
* else an applying ALLOW on the operation (or ALL) grants it; an ALLOW on READ, WRITE, DELETE
  or ALTER also grants DESCRIBE, and ALLOW on ALTER_CONFIGS grants DESCRIBE_CONFIGS;
* nothing applying refuses.

Roles of the user store count as ALLOW bindings of the user (:func:`role_bindings`), so a DENY
binding narrows a role; ``admin`` is a super user, allowed everything before any binding is
looked at, as Kafka's ``super.users``.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass

#: The one name of the CLUSTER resource, as Kafka has it.
CLUSTER_NAME = "kafka-cluster"
#: The LITERAL resource name that matches every name of its type.
WILDCARD = "*"


class ResourceType(enum.IntEnum):
    UNKNOWN = 0
    ANY = 1
    TOPIC = 2
    GROUP = 3
    CLUSTER = 4
    TRANSACTIONAL_ID = 5


class PatternType(enum.IntEnum):
    UNKNOWN = 0
    ANY = 1
    MATCH = 2
    LITERAL = 3
    PREFIXED = 4


class AclOperation(enum.IntEnum):
    UNKNOWN = 0
    ANY = 1
    ALL = 2
    READ = 3
    WRITE = 4
    CREATE = 5
    DELETE = 6
    ALTER = 7
    DESCRIBE = 8
    CLUSTER_ACTION = 9
    DESCRIBE_CONFIGS = 10
    ALTER_CONFIGS = 11
    IDEMPOTENT_WRITE = 12


class AclPermission(enum.IntEnum):
    UNKNOWN = 0
    ANY = 1
    DENY = 2
    ALLOW = 3


#: operation asked -> the ALLOWed operations that grant it (Kafka's implied operations).
_GRANTED_BY: dict[AclOperation, frozenset[AclOperation]] = {
    op: frozenset({op, AclOperation.ALL}) for op in AclOperation}
_GRANTED_BY[AclOperation.DESCRIBE] = frozenset({
    AclOperation.DESCRIBE, AclOperation.READ, AclOperation.WRITE, AclOperation.DELETE,
    AclOperation.ALTER, AclOperation.ALL})
_GRANTED_BY[AclOperation.DESCRIBE_CONFIGS] = frozenset({
    AclOperation.DESCRIBE_CONFIGS, AclOperation.ALTER_CONFIGS, AclOperation.ALL})

_CONCRETE_TYPES = frozenset({ResourceType.TOPIC, ResourceType.GROUP, ResourceType.CLUSTER,
                             ResourceType.TRANSACTIONAL_ID})


class InvalidAcl(ValueError):
    """A binding or filter that cannot be stored or matched (answered INVALID_REQUEST)."""


@dataclass(frozen=True, slots=True)
class AclBinding:
    """One ACL: ``principal`` from ``host`` may (ALLOW) or may not (DENY) ``operation`` on the
    resources ``pattern`` ``name`` of ``resource_type`` names."""

    resource_type: ResourceType
    name: str
    pattern: PatternType
    principal: str
    host: str
    operation: AclOperation
    permission: AclPermission

    def applies_to(self, name: str) -> bool:
        """Whether this binding's resource pattern covers the resource ``name``."""
        if self.pattern is PatternType.PREFIXED:
            return name.startswith(self.name)
        return self.name == name or self.name == WILDCARD


def check_binding(b: AclBinding) -> AclBinding:
    """``b`` when it can be stored; :class:`InvalidAcl` saying why, as Kafka refuses it."""
    if b.resource_type not in _CONCRETE_TYPES:
        raise InvalidAcl(f"resource type {_name(ResourceType, b.resource_type)} is not a "
                         "concrete type (TOPIC, GROUP, CLUSTER, TRANSACTIONAL_ID)")
    if b.pattern not in (PatternType.LITERAL, PatternType.PREFIXED):
        raise InvalidAcl(f"pattern type {_name(PatternType, b.pattern)}: LITERAL or PREFIXED")
    if not b.name:
        raise InvalidAcl("the resource name is empty")
    if b.resource_type is ResourceType.CLUSTER and (b.name != CLUSTER_NAME
                                                   or b.pattern is not PatternType.LITERAL):
        raise InvalidAcl(f"the CLUSTER resource is named {CLUSTER_NAME!r} (LITERAL)")
    kind, sep, who = b.principal.partition(":")
    if not sep or kind != "User" or not who:
        raise InvalidAcl(f"principal {b.principal!r}: User:<name> or User:*")
    if not b.host:
        raise InvalidAcl("the host is empty ('*' for any host)")
    if b.operation in (AclOperation.UNKNOWN, AclOperation.ANY):
        raise InvalidAcl(f"operation {_name(AclOperation, b.operation)} is not concrete")
    if b.permission not in (AclPermission.ALLOW, AclPermission.DENY):
        raise InvalidAcl(f"permission {_name(AclPermission, b.permission)}: ALLOW or DENY")
    return b


def _name(kind: type[enum.IntEnum], value: int) -> str:
    try:
        return kind(value).name
    except ValueError:
        return str(value)


def binding(resource_type: int, name: str, pattern: int, principal: str, host: str,
            operation: int, permission: int) -> AclBinding:
    """A checked binding from wire numbers; :class:`InvalidAcl` for an unknown number."""
    try:
        b = AclBinding(ResourceType(resource_type), name, PatternType(pattern), principal, host,
                       AclOperation(operation), AclPermission(permission))
    except ValueError as exc:
        raise InvalidAcl(str(exc)) from None
    return check_binding(b)


@dataclass(frozen=True, slots=True)
class AclFilter:
    """What DescribeAcls and DeleteAcls select: ANY / None match everything in their field;
    pattern MATCH selects the bindings that apply to the resource ``name`` (LITERAL equal or
    ``*``, PREFIXED a prefix of it)."""

    resource_type: ResourceType = ResourceType.ANY
    name: str | None = None
    pattern: PatternType = PatternType.ANY
    principal: str | None = None
    host: str | None = None
    operation: AclOperation = AclOperation.ANY
    permission: AclPermission = AclPermission.ANY

    def matches(self, b: AclBinding) -> bool:
        if self.resource_type is not ResourceType.ANY and b.resource_type is not self.resource_type:
            return False
        if self.pattern is PatternType.MATCH:
            if self.name is not None and not b.applies_to(self.name):
                return False
        else:
            if self.pattern is not PatternType.ANY and b.pattern is not self.pattern:
                return False
            if self.name is not None and b.name != self.name:
                return False
        return ((self.principal is None or b.principal == self.principal)
                and (self.host is None or b.host == self.host)
                and (self.operation is AclOperation.ANY or b.operation is self.operation)
                and (self.permission is AclPermission.ANY or b.permission is self.permission))


def acl_filter(resource_type: int, name: str | None, pattern: int, principal: str | None,
               host: str | None, operation: int, permission: int) -> AclFilter:
    """A filter from wire numbers; :class:`InvalidAcl` for an UNKNOWN or unknown number."""
    try:
        f = AclFilter(ResourceType(resource_type), name, PatternType(pattern), principal, host,
                      AclOperation(operation), AclPermission(permission))
    except ValueError as exc:
        raise InvalidAcl(str(exc)) from None
    if ResourceType.UNKNOWN in (f.resource_type,) or f.pattern is PatternType.UNKNOWN \
            or f.operation is AclOperation.UNKNOWN or f.permission is AclPermission.UNKNOWN:
        raise InvalidAcl("a filter field is UNKNOWN")
    return f


def _allow(resource_type: ResourceType, name: str, principal: str,
           *ops: AclOperation) -> list[AclBinding]:
    return [AclBinding(resource_type, name, PatternType.LITERAL, principal, WILDCARD, op,
                       AclPermission.ALLOW) for op in ops]


def role_bindings(user: str, roles: Iterable[str]) -> list[AclBinding]:
    """The ALLOW bindings the ``producer`` and ``consumer`` roles amount to for ``user``
    (``admin`` is a super user instead; docs/security.md has the table)."""
    who = f"User:{user}"
    out: list[AclBinding] = []
    op = AclOperation
    for role in roles:
        if role == "producer":
            out += _allow(ResourceType.TOPIC, WILDCARD, who, op.WRITE, op.DESCRIBE, op.CREATE)
            out += _allow(ResourceType.TRANSACTIONAL_ID, WILDCARD, who, op.WRITE, op.DESCRIBE)
            out += _allow(ResourceType.CLUSTER, CLUSTER_NAME, who, op.IDEMPOTENT_WRITE)
        elif role == "consumer":
            out += _allow(ResourceType.TOPIC, WILDCARD, who, op.READ, op.DESCRIBE)
            out += _allow(ResourceType.GROUP, WILDCARD, who, op.READ, op.DESCRIBE)
    return out


class Authorizer:
    """The decision over one set of bindings and super users.  Immutable; built again when
    the user store changes (:meth:`UserStore.current` hands a new snapshot)."""

    def __init__(self, bindings: Iterable[AclBinding], super_users: Iterable[str] = ()) -> None:
        self._supers = frozenset(f"User:{u}" for u in super_users)
        #: resource type -> its bindings: a check looks at one type's only.
        self._by_type: dict[ResourceType, list[AclBinding]] = {}
        for b in bindings:
            self._by_type.setdefault(b.resource_type, []).append(b)

    def allowed(self, principal: str, host: str, operation: AclOperation,
                resource_type: ResourceType, name: str) -> bool:
        """Whether ``principal`` connected from ``host`` may ``operation`` the resource."""
        if principal in self._supers:
            return True
        granted_by = _GRANTED_BY[operation]
        allow = False
        for b in self._by_type.get(resource_type, ()):
            if (b.principal != principal and b.principal != "User:*") \
                    or (b.host != WILDCARD and b.host != host) or not b.applies_to(name):
                continue
            if b.permission is AclPermission.DENY:
                if b.operation is operation or b.operation is AclOperation.ALL:
                    return False
            elif b.operation in granted_by:
                allow = True
        return allow

    def allowed_any(self, principal: str, host: str, operation: AclOperation,
                    resource_type: ResourceType) -> bool:
        """Whether ``principal`` may ``operation`` some resource of the type (Kafka's
        ``authorizeByResourceType``, as an idempotent producer's InitProducerId asks): an
        ALLOW on the operation (or ALL) whose resources a DENY does not cover whole."""
        if principal in self._supers:
            return True
        mine = [b for b in self._by_type.get(resource_type, ())
                if (b.principal == principal or b.principal == "User:*")
                and (b.host == WILDCARD or b.host == host)
                and (b.operation is operation or b.operation is AclOperation.ALL)]
        denies = [b for b in mine if b.permission is AclPermission.DENY]
        for b in mine:
            if b.permission is not AclPermission.ALLOW:
                continue
            if b.pattern is PatternType.LITERAL and b.name != WILDCARD:
                if not any(d.applies_to(b.name) for d in denies):
                    return True
            elif not any((d.pattern is PatternType.LITERAL and d.name == WILDCARD)
                         or (d.pattern is PatternType.PREFIXED and b.name.startswith(d.name))
                         for d in denies):
                return True
        return False

    def cluster(self, principal: str, host: str, operation: AclOperation) -> bool:
        """Shorthand for the one CLUSTER resource."""
        return self.allowed(principal, host, operation, ResourceType.CLUSTER, CLUSTER_NAME)
