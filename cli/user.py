"""``txbroker user``: add, list, delete users, set passwords, make access keys.

Two stores, one set of commands.  Without ``--etcd-endpoints`` the commands edit the users
file directly (``service/users.py``: locked, atomic); a broker using that file reads it again
on its own, so no broker needs to be reachable or restarted.  With ``--etcd-endpoints`` (or
``TXBROKER_ETCD_ENDPOINTS``) they edit the cluster's user store in etcd
(``cluster/user_keys.py``), which every broker of an etcd-mode cluster polls each second.
Nothing here prints a password, a SCRAM credential or an existing secret: ``access-key``
prints the new secret once, because it cannot be shown again.
"""

from __future__ import annotations

import asyncio
import functools
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import click

from txbroker.cli.common import CommandError, command_name
from txbroker.service.cluster_auth import CLUSTER_ACCESS_KEY
from txbroker.service.users import (
    ROLES,
    Users,
    UsersFileError,
    UserStoreError,
    edit_users,
    load_users,
)

#: The users file in the default data dir, where ``txbroker serve`` run from the same
#: directory keeps its data.
DEFAULT_USERS_FILE = "txbroker-data/users.json"

_T = TypeVar("_T")


@dataclass(frozen=True)
class StoreTarget:
    """The store a command works on: the users file, or the cluster's store in etcd."""

    users_file: str
    etcd_endpoints: str | None
    etcd_prefix: str
    cluster_name: str
    etcd_user: str | None
    etcd_password: str | None
    #: TLS to etcd: the CA members are verified against, and this command's certificate and
    #: key when members require one (all None: plaintext).
    etcd_ca: str | None = None
    etcd_cert: str | None = None
    etcd_key: str | None = None

    @property
    def where(self) -> str:
        if not self.etcd_endpoints:
            return f"users file {self.users_file}"
        from txbroker.cluster.user_keys import users_key

        return f"etcd {users_key(self.etcd_prefix, self.cluster_name).decode()}"

    def in_etcd(self, work: Callable[[Any], Any]) -> Any:
        from txbroker.cluster.etcd import Etcd, EtcdError, EtcdTLS, parse_endpoints
        from txbroker.cluster.user_keys import EtcdUsers

        assert self.etcd_endpoints
        try:
            endpoints = parse_endpoints(self.etcd_endpoints)
        except ValueError as exc:
            raise ValueError(f"--etcd-endpoints: {exc}") from None

        try:
            tls = None if self.etcd_ca is None else EtcdTLS.from_files(
                self.etcd_ca, self.etcd_cert, self.etcd_key)
        except OSError as exc:
            raise ValueError(f"etcd TLS files: {exc.filename}: {exc.strerror}") from None

        async def run() -> Any:
            etcd = Etcd(endpoints, timeout=3.0, tls=tls, user=self.etcd_user,
                        password=self.etcd_password)
            try:
                return await work(EtcdUsers(etcd, self.etcd_prefix, self.cluster_name))
            finally:
                await etcd.close()
        try:
            return asyncio.run(run())
        except EtcdError as exc:
            raise UserStoreError(f"{self.where}: {exc}") from None

    def edit(self, edit: Callable[[Users], tuple[Users, _T]]) -> _T:
        """Apply ``edit`` (pure) to the store and write the result (one etcd transaction,
        or the locked atomic rewrite of the file)."""
        if self.etcd_endpoints:
            async def work(doc: Any) -> _T:
                return (await doc.edit(edit))[0]
            return self.in_etcd(work)
        with edit_users(self.users_file) as box:
            box[0], answer = edit(box[0])
        return answer

    def read(self) -> Users:
        if self.etcd_endpoints:
            async def work(doc: Any) -> Users:
                return (await doc.read())[0]
            return self.in_etcd(work)
        return load_users(self.users_file, missing_ok=True)


def store_options(f: Callable[..., Any]) -> Callable[..., Any]:
    """``--users-file`` and the etcd options, handed to the command as ``store``."""
    @functools.wraps(f)
    def wrapper(*args: Any, users_file: str, etcd_endpoints: str | None, etcd_prefix: str,
                cluster_name: str, etcd_user: str | None, etcd_ca: str | None,
                etcd_cert: str | None, etcd_key: str | None, **kw: Any) -> Any:
        import os

        store = StoreTarget(users_file, etcd_endpoints or None, etcd_prefix, cluster_name,
                            etcd_user, os.environ.get("TXBROKER_ETCD_PASSWORD"),
                            etcd_ca, etcd_cert, etcd_key)
        return f(*args, store=store, **kw)
    for option in reversed([
        click.option("--users-file", envvar="TXBROKER_USERS_FILE", default=DEFAULT_USERS_FILE,
                     show_default=True, type=click.Path(dir_okay=False),
                     help="The users file (env TXBROKER_USERS_FILE), when not on etcd."),
        click.option("--etcd-endpoints", envvar="TXBROKER_ETCD_ENDPOINTS", default=None,
                     metavar="ADDRS", help="etcd members, 'h:p;h:p' (as the brokers' "
                     "--etcd-endpoints): work on the cluster's user store in etcd instead of "
                     "the users file."),
        click.option("--etcd-prefix", envvar="TXBROKER_ETCD_PREFIX", default="/txbroker",
                     show_default=True, metavar="KEY", help="as the brokers' --etcd-prefix"),
        click.option("--cluster-name", envvar="TXBROKER_CLUSTER_NAME", default="DefaultCluster",
                     show_default=True, metavar="NAME", help="as the brokers' --cluster-name"),
        click.option("--etcd-user", envvar="TXBROKER_ETCD_USER", default=None, metavar="NAME",
                     help="etcd's own authentication (the password from "
                          "TXBROKER_ETCD_PASSWORD)."),
        click.option("--etcd-ca", envvar="TXBROKER_ETCD_CA", default=None,
                     type=click.Path(dir_okay=False), help="TLS to etcd: the PEM CA its members "
                     "are verified against (env TXBROKER_ETCD_CA)."),
        click.option("--etcd-cert", envvar="TXBROKER_ETCD_CERT", default=None,
                     type=click.Path(dir_okay=False), help="TLS to etcd: a PEM certificate "
                     "for members that require one (env TXBROKER_ETCD_CERT)."),
        click.option("--etcd-key", envvar="TXBROKER_ETCD_KEY", default=None,
                     type=click.Path(dir_okay=False), help="The key of --etcd-cert "
                     "(env TXBROKER_ETCD_KEY)."),
    ]):
        wrapper = option(wrapper)
    return wrapper


def fail(store: StoreTarget, exc: Exception) -> CommandError:
    ctx = click.get_current_context(silent=True)
    if isinstance(exc, (UsersFileError, UserStoreError)):  # it names the store already
        return CommandError(command_name(ctx), None, str(exc))
    return CommandError(command_name(ctx), store.where, str(exc))


def _read_password(password_stdin: bool) -> str:
    if password_stdin:
        return sys.stdin.readline().rstrip("\r\n")
    return click.prompt("password", hide_input=True, confirmation_prompt=True)


@click.group()
def user() -> None:
    """Users of the broker: passwords for Kafka SASL/SCRAM, access keys for RocketMQ clients."""


_ERRORS = (ValueError, OSError, UserStoreError)


@user.command()
@click.argument("name")
@click.option("--password-stdin", is_flag=True,
              help="Read the password from the first line of stdin (default: prompt twice).")
@click.option("--role", "roles", multiple=True, type=click.Choice(ROLES),
              help="A role (repeat for several): admin, producer (publish to every topic), "
                   "consumer (subscribe and consume in every group).")
@store_options
def add(name: str, password_stdin: bool, roles: tuple[str, ...], store: StoreTarget) -> None:
    """Add user NAME with a password (stored only as SCRAM-SHA-256/512 credentials)."""
    if name == CLUSTER_ACCESS_KEY:  # its password is cluster_secret (docs/security.md)
        raise fail(store, ValueError(
            f"user name {name!r} is reserved: it is the account brokers log in to each "
            f"other's Kafka ports with, its password is the cluster_secret"))

    def edit(users: Users) -> tuple[Users, None]:
        if name in users.users:
            raise ValueError(f"user {name!r} exists (use 'txbroker user passwd')")
        return users.with_password(name, password, roles), None
    try:
        password = _read_password(password_stdin)
        store.edit(edit)
    except _ERRORS as exc:
        raise fail(store, exc) from None
    click.echo(f"user {name} added" + (f" with role(s) {', '.join(roles)}" if roles else ""))


@user.command()
@click.argument("name")
@click.option("--password-stdin", is_flag=True,
              help="Read the password from the first line of stdin (default: prompt twice).")
@store_options
def passwd(name: str, password_stdin: bool, store: StoreTarget) -> None:
    """Set a new password for user NAME (new salts too; its access keys stay)."""
    def edit(users: Users) -> tuple[Users, None]:
        if name not in users.users:
            raise ValueError(f"no user {name!r}")
        return users.with_password(name, password), None
    try:
        password = _read_password(password_stdin)
        store.edit(edit)
    except _ERRORS as exc:
        raise fail(store, exc) from None
    click.echo(f"password of user {name} changed")


@user.command()
@click.argument("name")
@store_options
def delete(name: str, store: StoreTarget) -> None:
    """Delete user NAME and its access keys."""
    try:
        store.edit(lambda users: (users.without(name), None))
    except _ERRORS as exc:
        raise fail(store, exc) from None
    click.echo(f"user {name} deleted")


@user.command("access-key")
@click.argument("name")
@store_options
def access_key(name: str, store: StoreTarget) -> None:
    """Create a RocketMQ access key and secret for user NAME; the secret is printed only now."""
    def edit(users: Users) -> tuple[Users, tuple[str, str]]:
        after, key, secret = users.with_access_key(name)
        return after, (key, secret)
    try:
        key, secret = store.edit(edit)
    except _ERRORS as exc:
        raise fail(store, exc) from None
    click.echo(f"access key {key} created for user {name}")
    click.echo(f"accessKey: {key}")
    click.echo(f"secretKey: {secret}")


@user.command("list")
@store_options
def list_(store: StoreTarget) -> None:
    """List users: name, roles, SCRAM mechanisms and access keys (never secrets)."""
    try:
        users = store.read()
    except _ERRORS as exc:
        raise fail(store, exc) from None
    for u in sorted(users.users.values(), key=lambda u: u.name):
        click.echo(f"{u.name}  roles={','.join(u.roles) or '-'}  "
                   f"scram={','.join(sorted(u.scram)) or '-'}  "
                   f"access_keys={','.join(sorted(u.access_keys)) or '-'}")
    click.echo(f"{len(users.users)} user(s) in {store.where.removeprefix('users file ')}")


@user.command("import")
@click.argument("source", type=click.Path(dir_okay=False, exists=True))
@store_options
def import_(source: str, store: StoreTarget) -> None:
    """Make the users file SOURCE the cluster's user store in etcd (etcd mode), once: refused
    when the store exists or was ever made, so no deleted user or binding comes back."""
    try:
        if not store.etcd_endpoints:
            raise ValueError("needs --etcd-endpoints (or TXBROKER_ETCD_ENDPOINTS): the users "
                             "file is imported into etcd")
        users = load_users(source)

        async def work(doc: Any) -> bool:
            return await doc.import_file(users, f"txbroker user import {source}")
        if not store.in_etcd(work):
            raise ValueError("the cluster's user store exists already (or was made once): "
                             "nothing imported; edit it with 'txbroker user' / 'acl'")
    except _ERRORS as exc:
        raise fail(store, exc) from None
    click.echo(f"imported {len(users.users)} user(s) and {len(users.acls)} Kafka ACL "
               f"binding(s) from {source} into {store.where}")
