"""``txbroker acl``: add, list and delete the Kafka ACL bindings of the users file.

The options are those of Kafka's ``kafka-acls.sh`` (``--allow-principal User:alice
--operation Read --topic T``, ``--resource-pattern-type prefixed``, ``--deny-principal``...),
so its examples carry over.  Like ``txbroker user``, the commands edit the users file
directly (``service/users.py``: locked, atomic), which a broker using it reads again on its
own, or with ``--etcd-endpoints`` the cluster's user store in etcd, which every broker polls.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click

from txbroker.cli.user import StoreTarget, fail, store_options
from txbroker.service.kafka.acls import (
    CLUSTER_NAME,
    WILDCARD,
    AclBinding,
    AclFilter,
    AclOperation,
    AclPermission,
    InvalidAcl,
    PatternType,
    ResourceType,
    check_binding,
)
from txbroker.service.users import Users, UserStoreError

#: ``--operation`` values as kafka-acls.sh spells them (any case, with or without '_').
OPERATIONS = {op.name.replace("_", "").lower(): op for op in AclOperation
              if op not in (AclOperation.UNKNOWN, AclOperation.ANY)}


def _operation(ctx: click.Context, param: click.Parameter, values: tuple[str, ...]) -> list:
    out = []
    for v in values:
        op = OPERATIONS.get(v.replace("_", "").replace("-", "").lower())
        if op is None:
            raise click.BadParameter(f"{v!r} (known: {', '.join(sorted(OPERATIONS))})")
        out.append(op)
    return out


def _resource_options(f: Callable[..., Any]) -> Callable[..., Any]:
    for option in reversed([
        click.option("--topic", "topics", multiple=True, help="A topic (repeat for several; "
                     "'*' is every topic)."),
        click.option("--group", "groups", multiple=True, help="A consumer group ('*': all)."),
        click.option("--transactional-id", "txn_ids", multiple=True,
                     help="A transactional id ('*': all)."),
        click.option("--cluster", is_flag=True, help="The cluster resource."),
    ]):
        f = option(f)
    return f


def _resources(topics: tuple[str, ...], groups: tuple[str, ...], txn_ids: tuple[str, ...],
               cluster: bool) -> list[tuple[ResourceType, str]]:
    return ([(ResourceType.TOPIC, t) for t in topics] + [(ResourceType.GROUP, g) for g in groups]
            + [(ResourceType.TRANSACTIONAL_ID, x) for x in txn_ids]
            + ([(ResourceType.CLUSTER, CLUSTER_NAME)] if cluster else []))


def describe_binding(b: AclBinding) -> str:
    """One line per binding, in kafka-acls.sh's words."""
    return (f"{b.resource_type.name}:{b.pattern.name}:{b.name}  {b.principal} has "
            f"{b.permission.name} permission for operation {b.operation.name} from host {b.host}")


@click.group()
def acl() -> None:
    """Kafka ACLs in the user store: who may do what on topics, groups, transactional ids and
    the cluster (docs/security.md, "Kafka ACLs")."""


@acl.command()
@click.option("--allow-principal", "allow", multiple=True, help="User:<name> or User:* allowed.")
@click.option("--deny-principal", "deny", multiple=True, help="User:<name> or User:* denied.")
@click.option("--allow-host", default=WILDCARD, show_default=True,
              help="Address the allowed principals connect from.")
@click.option("--deny-host", default=WILDCARD, show_default=True,
              help="Address the denied principals connect from.")
@click.option("--operation", "operations", multiple=True, required=True, callback=_operation,
              help="Read, Write, Create, Delete, Alter, Describe, ClusterAction, "
                   "DescribeConfigs, AlterConfigs, IdempotentWrite or All (repeat for several).")
@_resource_options
@click.option("--resource-pattern-type", "pattern", default="literal", show_default=True,
              type=click.Choice(["literal", "prefixed"], case_sensitive=False),
              help="literal: the name itself ('*' matches all); prefixed: names starting so.")
@store_options
def add(allow: tuple[str, ...], deny: tuple[str, ...], allow_host: str, deny_host: str,
        operations: list[AclOperation], topics: tuple[str, ...], groups: tuple[str, ...],
        txn_ids: tuple[str, ...], cluster: bool, pattern: str, store: StoreTarget) -> None:
    """Add bindings: every principal x operation x resource given."""
    resources = _resources(topics, groups, txn_ids, cluster)
    pattern_type = PatternType[pattern.upper()]
    try:
        if not resources:
            raise ValueError("name a resource: --topic, --group, --transactional-id or --cluster")
        if not allow and not deny:
            raise ValueError("name a principal: --allow-principal or --deny-principal")
        new = [check_binding(AclBinding(kind, name, pattern_type, who, host, op, perm))
               for perm, whos, host in ((AclPermission.ALLOW, allow, allow_host),
                                        (AclPermission.DENY, deny, deny_host))
               for who in whos for kind, name in resources for op in operations]
        store.edit(lambda users: (users.with_acls(new), None))
    except (ValueError, OSError, UserStoreError) as exc:
        raise fail(store, exc) from None
    for b in new:
        click.echo(f"added  {describe_binding(b)}")


def _selection(principal: str | None, topics: tuple[str, ...], groups: tuple[str, ...],
               txn_ids: tuple[str, ...], cluster: bool, pattern: str) -> list[AclFilter]:
    pattern_type = PatternType[pattern.upper()]
    resources = _resources(topics, groups, txn_ids, cluster)
    if not resources:
        return [AclFilter(principal=principal, pattern=pattern_type)]
    return [AclFilter(kind, name, pattern_type, principal) for kind, name in resources]


_pattern_filter = click.option(
    "--resource-pattern-type", "pattern", default="any", show_default=True,
    type=click.Choice(["any", "match", "literal", "prefixed"], case_sensitive=False),
    help="any: bindings of the exact names given, any pattern; match: every binding that "
         "applies to the names; literal / prefixed: that pattern only.")


@acl.command("list")
@click.option("--principal", default=None, help="Only this principal's bindings.")
@_resource_options
@_pattern_filter
@store_options
def list_(principal: str | None, topics: tuple[str, ...], groups: tuple[str, ...],
          txn_ids: tuple[str, ...], cluster: bool, pattern: str, store: StoreTarget) -> None:
    """List bindings (all, or those of the resources and principal given)."""
    try:
        users = store.read()
    except (ValueError, OSError, UserStoreError) as exc:
        raise fail(store, exc) from None
    selection = _selection(principal, topics, groups, txn_ids, cluster, pattern)
    shown = [b for b in users.acls if any(f.matches(b) for f in selection)]
    for b in shown:
        click.echo(describe_binding(b))
    click.echo(f"{len(shown)} ACL binding(s) in {_place(store)}")


@acl.command()
@click.option("--principal", default=None, help="Only this principal's bindings.")
@_resource_options
@_pattern_filter
@click.option("--operation", "operations", multiple=True, callback=_operation,
              help="Only these operations (default: all).")
@store_options
def delete(principal: str | None, topics: tuple[str, ...], groups: tuple[str, ...],
           txn_ids: tuple[str, ...], cluster: bool, pattern: str,
           operations: list[AclOperation], store: StoreTarget) -> None:
    """Delete the bindings of the resources and/or principal given."""
    selection = _selection(principal, topics, groups, txn_ids, cluster, pattern)
    if operations:
        selection = [AclFilter(f.resource_type, f.name, f.pattern, f.principal, f.host, op)
                     for f in selection for op in operations]
    def edit(users: Users) -> tuple[Users, list[AclBinding]]:
        gone: list[AclBinding] = []
        for f in selection:
            users, removed = users.without_acls(f)
            gone += removed
        return users, gone
    try:
        if principal is None and not _resources(topics, groups, txn_ids, cluster):
            raise ValueError("name a resource or --principal (nothing is deleted wholesale)")
        gone = store.edit(edit)
    except (ValueError, OSError, InvalidAcl, UserStoreError) as exc:
        raise fail(store, exc) from None
    for b in gone:
        click.echo(f"deleted  {describe_binding(b)}")
    click.echo(f"{len(gone)} ACL binding(s) deleted from {_place(store)}")


def _place(store: StoreTarget) -> str:
    """The users file's path, or the etcd key, as the summary lines name it."""
    return store.where.removeprefix("users file ")
