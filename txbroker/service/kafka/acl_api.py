"""DescribeAcls (29), CreateAcls (30) and DeleteAcls (31): Kafka's admin tools on the ACL
bindings of the user store (docs/security.md, "Kafka ACLs").

The bindings live in the user store (``service/users.py``'s :class:`UserSource`): the users
file of a broker, or in etcd mode the cluster's store in etcd (``cluster/user_keys.py``),
which every broker of every group reads.  CreateAcls and DeleteAcls apply their pure edit
through the store's ``update`` and answer only once the store holds the result (a store that
did not take it: UNKNOWN_SERVER_ERROR for each creation or filter, nothing changed), and the
broker's next request is decided on it.  DescribeAcls reads the store as it is now.  Without
a user store there is nothing to keep bindings in: every request is answered
SECURITY_DISABLED, as Kafka answers without an authorizer.  Who may call these is the
authorization step's business (``authorize.py``: DESCRIBE or ALTER on the cluster).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from txbroker.remoting.kafka.apis import ApiKey
from txbroker.remoting.kafka.errors import ErrorCode
from txbroker.service.kafka.acls import (
    AclBinding,
    InvalidAcl,
    PatternType,
    acl_filter,
    binding,
)
from txbroker.service.kafka.context import Handler, KafkaRequestContext
from txbroker.service.users import Users, UserSource, UserStoreError

_NO_STORE = "no users_file: Kafka ACLs are kept in the user store"


def _wire(b: AclBinding) -> dict:
    return {"resource_type": int(b.resource_type), "resource_name": b.name,
            "pattern_type": int(b.pattern), "principal": b.principal, "host": b.host,
            "operation": int(b.operation), "permission_type": int(b.permission)}


#: Version 0 of the three APIs (Kafka 3.9's; Kafka 4 serves from 1, sarama 1.22 sends 0) names
#: no pattern type: Kafka reads it as LITERAL, in creations and in filters alike, so a v0
#: caller sees and deletes only literal bindings.
_V0_PATTERN = int(PatternType.LITERAL)


def _filter_of(f: dict) -> Any:
    return acl_filter(f["resource_type_filter"], f["resource_name_filter"],
                      f.get("pattern_type_filter", _V0_PATTERN), f["principal_filter"],
                      f["host_filter"], f["operation"], f["permission_type"])


def describe(users: Users, body: dict) -> dict:
    """The DescribeAcls answer over one snapshot: matching bindings by resource pattern."""
    try:
        selected = _filter_of(body)
    except InvalidAcl as exc:
        return {"error_code": ErrorCode.INVALID_REQUEST, "error_message": str(exc),
                "resources": []}
    by_resource: dict[tuple, list[dict]] = {}
    for b in users.acls:
        if selected.matches(b):
            by_resource.setdefault((b.resource_type, b.name, b.pattern), []).append(
                {"principal": b.principal, "host": b.host, "operation": int(b.operation),
                 "permission_type": int(b.permission)})
    return {"error_code": ErrorCode.NONE, "error_message": None, "resources": [
        {"resource_type": int(t), "resource_name": n, "pattern_type": int(p), "acls": acls}
        for (t, n, p), acls in by_resource.items()]}


def create(users: Users, body: dict) -> tuple[Users, dict]:
    """(snapshot with the valid creations added, the CreateAcls answer)."""
    results, new = [], []
    for c in body.get("creations") or ():
        try:
            new.append(binding(c["resource_type"], c["resource_name"],
                               c.get("resource_pattern_type", _V0_PATTERN), c["principal"],
                               c["host"], c["operation"], c["permission_type"]))
        except InvalidAcl as exc:
            results.append({"error_code": ErrorCode.INVALID_REQUEST, "error_message": str(exc)})
        else:
            results.append({"error_code": ErrorCode.NONE, "error_message": None})
    return (users.with_acls(new) if new else users), {"results": results}


def delete(users: Users, body: dict) -> tuple[Users, dict]:
    """(snapshot without what the filters match, the DeleteAcls answer)."""
    out = []
    for f in body.get("filters") or ():
        try:
            selected = _filter_of(f)
        except InvalidAcl as exc:
            out.append({"error_code": ErrorCode.INVALID_REQUEST, "error_message": str(exc),
                        "matching_acls": []})
            continue
        users, gone = users.without_acls(selected)
        out.append({"error_code": ErrorCode.NONE, "error_message": None, "matching_acls": [
            {"error_code": ErrorCode.NONE, "error_message": None, **_wire(b)} for b in gone]})
    return users, {"filter_results": out}


def acl_handlers(store: UserSource | None) -> dict[int, Handler]:
    """The three ACL APIs on ``store`` (SECURITY_DISABLED without one)."""

    async def edited(apply: Callable[[Users, dict], tuple[Users, dict]], body: dict,
                     failure: Callable[[str], dict]) -> dict:
        assert store is not None
        try:
            return await store.update(lambda users: apply(users, body))
        except UserStoreError as exc:
            return failure(str(exc))

    async def describe_acls(ctx: KafkaRequestContext, body: dict) -> dict:
        if store is None:
            return {"error_code": ErrorCode.SECURITY_DISABLED, "error_message": _NO_STORE}
        try:
            users = await store.fresh()
        except UserStoreError as exc:
            return {"error_code": ErrorCode.UNKNOWN_SERVER_ERROR, "error_message": str(exc),
                    "resources": []}
        return describe(users, body)

    async def create_acls(ctx: KafkaRequestContext, body: dict) -> dict:
        def refused(code: int, why: str) -> dict:
            return {"results": [{"error_code": code, "error_message": why}
                                for _ in body.get("creations") or ()]}
        if store is None:
            return refused(ErrorCode.SECURITY_DISABLED, _NO_STORE)
        return await edited(create, body, lambda why: refused(ErrorCode.UNKNOWN_SERVER_ERROR,
                                                              why))

    async def delete_acls(ctx: KafkaRequestContext, body: dict) -> dict:
        def refused(code: int, why: str) -> dict:
            return {"filter_results": [{"error_code": code, "error_message": why,
                                        "matching_acls": []} for _ in body.get("filters") or ()]}
        if store is None:
            return refused(ErrorCode.SECURITY_DISABLED, _NO_STORE)
        return await edited(delete, body, lambda why: refused(ErrorCode.UNKNOWN_SERVER_ERROR,
                                                              why))

    return {ApiKey.DESCRIBE_ACLS: describe_acls, ApiKey.CREATE_ACLS: create_acls,
            ApiKey.DELETE_ACLS: delete_acls}
