"""The user store: one file of accounts for both protocols (docs/security.md "Users").

A user has a name, roles, SCRAM credentials (for Kafka clients' SCRAM-SHA-256/512) and any
number of RocketMQ access keys (for clients that sign requests as RocketMQ's plain ACL asks).
The password itself is never stored: only the salted SCRAM credentials of ``scram.py``, from
which nobody can log in.  An access key's secret *is* stored, because RocketMQ's signature is an
HMAC keyed with it and the broker must compute the same HMAC; that is why the file is written
with mode 0600 and why nothing here logs or prints a secret.

The file is JSON, written only by :func:`edit_users` (``txbroker user ...``): under an
exclusive lock, to a temporary file made 0600 from its first byte, synced, then renamed over
the old one, so a reader sees the old file or the new one, never half of one.  A broker holds a
:class:`UserStore`, which looks at the file's identity (inode, size, mtime) at most once per
``check_interval`` and reads it again when it changed: no restart after ``txbroker user add``.
A file that turns bad while the broker runs leaves the previous users in force, with one error
line naming the file.

Roles are deliberately few (``ROLES``); ``acl_accounts`` turns them into the RocketMQ plain-ACL
accounts ``service/acl.py`` checks requests against, so that check needs nothing new to serve
the users of this file.

In etcd mode the same snapshot lives in etcd instead, one store for the whole cluster
(``txbroker/cluster/user_keys.py``): :class:`UserSource` is what both stores offer the broker,
so the RocketMQ ACL check, Kafka SASL and the Kafka authorizer do not know which one serves
them.

The file also holds the Kafka ACL bindings (``"acls"``, ``service/kafka/acls.py``; docs/security.md
"Kafka ACLs"), so users and what they may do change together under the one lock.  A file
with bindings is written as version 2; one without stays version 1, readable by brokers that
predate bindings.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import fcntl
import logging
import os
import re
import secrets
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from functools import cache, cached_property
from pathlib import Path
from typing import Any, Protocol, TypeVar

import orjson

from txbroker.config import ConfigError
from txbroker.service.acl_rules import Account, AclRules, Perm
from txbroker.service.kafka.acls import (
    AclBinding,
    AclFilter,
    AclOperation,
    AclPermission,
    Authorizer,
    PatternType,
    ResourceType,
    check_binding,
    role_bindings,
)
from txbroker.service.scram import (
    MECHANISMS,
    MIN_ITERATIONS,
    ScramCredentials,
    make_credentials,
    verify_password,
)

log = logging.getLogger(__name__)

FORMAT_VERSION = 2
#: The versions read: 1 has no "acls".
READABLE_VERSIONS = (1, 2)
#: What each role lets a user do.  RocketMQ: ``admin`` is the plain ACL's ``admin: true`` (admin
#: request codes, every topic and group); ``producer`` may publish to every topic; ``consumer``
#: may subscribe to every topic and consume in every group.  Roles add up.
ROLES = ("admin", "producer", "consumer")
_ROLE_PERMS = {  # role -> (default topic perm, default group perm)
    "admin": (Perm.PUB | Perm.SUB, Perm.PUB | Perm.SUB),
    "producer": (Perm.PUB, Perm(0)),
    "consumer": (Perm.SUB, Perm.SUB),
}
#: User names: what Kafka and RocketMQ tools accept without escaping (no ``,`` or ``=``, which
#: SCRAM's ``saslname`` would have to escape).
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._@-]{0,127}")
#: Bytes of the store's ``salt_key`` (see :attr:`Users.salt_key`).
SALT_KEY_BYTES = 32
#: The iteration count of a made-up credential: the one ``txbroker user add`` writes
#: (``make_credentials``' default), so an unknown user's work and answer look like a real one's.
UNKNOWN_USER_ITERATIONS = MIN_ITERATIONS


class UsersFileError(ConfigError):
    """The users file cannot be used; the message names the file and the entry."""


class UserStoreError(Exception):
    """A change the user store did not take (nothing changed); the message says where."""


_T = TypeVar("_T")


@dataclass(frozen=True)
class User:
    name: str
    roles: tuple[str, ...] = ()
    #: mechanism -> credentials (empty: no password set, no Kafka login)
    scram: Mapping[str, ScramCredentials] = field(default_factory=dict)
    #: RocketMQ access key -> its secret key
    access_keys: Mapping[str, str] = field(default_factory=dict, repr=False)


@dataclass(frozen=True)
class Users:
    """One version of the file: an immutable snapshot, edited by building a new one."""

    users: Mapping[str, User] = field(default_factory=dict)
    #: Kafka ACL bindings, in the order they were added (no two equal).
    acls: tuple[AclBinding, ...] = ()
    #: A random key kept with the users (made with the first password), from which the
    #: SCRAM salt of a name with no account is made up: stable across restarts, the same on
    #: every broker that reads this store, so such a name answers like a real account with a
    #: wrong password (PostgreSQL's ``mock_auth_nonce`` kept in ``pg_control``).  Empty in
    #: a store that has never had a password set.
    salt_key: bytes = field(default=b"", repr=False)

    @cached_property
    def authorizer(self) -> Authorizer:
        """Kafka's decision over this snapshot: the bindings, the roles' bindings, the
        ``admin`` users as super users (built once per snapshot)."""
        roles = [b for u in self.users.values() for b in role_bindings(u.name, u.roles)]
        return Authorizer([*self.acls, *roles],
                          [u.name for u in self.users.values() if "admin" in u.roles])

    def scram_credentials(self, user: str, mechanism: str) -> ScramCredentials | None:
        """The SASL/SCRAM server's lookup: None for an unknown user or mechanism, so the
        caller answers both the same way (no user enumeration)."""
        found = self.users.get(user)
        return None if found is None else found.scram.get(mechanism)

    def check_password(self, user: str, password: str) -> bool:
        """SASL/PLAIN's lookup: True when ``password`` derives the user's SCRAM credentials.

        The same work whoever asks: one derivation per mechanism, against the user's
        credentials or, for a name with no account (or no credentials for a mechanism), against
        a made-up credential of the same iteration count, and no early exit; otherwise a
        wrong password of a real account would answer later than an unknown name's, which
        tells who has an account."""
        found = self.users.get(user)
        scram = {} if found is None else found.scram
        ok = False
        for mechanism in MECHANISMS:
            cred = scram.get(mechanism)
            matched = verify_password(cred or _placeholder_credentials(mechanism), password)
            ok |= matched and cred is not None
        return ok

    def acl_accounts(self) -> dict[str, Account]:
        """Access key -> the plain-ACL account its user's roles amount to."""
        out = {}
        for user in self.users.values():
            topic, group = Perm(0), Perm(0)
            for role in user.roles:
                topic |= _ROLE_PERMS[role][0]
                group |= _ROLE_PERMS[role][1]
            for key, secret in user.access_keys.items():
                out[key] = Account(access_key=key, secret_key=secret, admin="admin" in user.roles,
                                   default_topic_perm=topic or Perm.DENY,
                                   default_group_perm=group or Perm.DENY)
        return out

    def acl_rules(self, base: AclRules) -> AclRules:
        """``base`` (a ``plain_acl.yml``'s rules) with this file's access keys added.

        An access key in both is refused rather than one silently winning.
        """
        mine = self.acl_accounts()
        both = sorted(set(mine) & set(base.accounts))
        if both:
            raise UsersFileError(f"access key(s) {', '.join(both)} are in the ACL file and the "
                                 f"users file")
        return AclRules(base.global_white, {**base.accounts, **mine})

    # --- edits (pure: each returns a new snapshot) ---------------------------------------------

    def with_password(self, name: str, password: str,
                      roles: tuple[str, ...] | None = None) -> Users:
        """``name`` created or updated with fresh credentials for every mechanism."""
        check_name(name)
        if not password:
            raise ValueError("the password must not be empty")
        old = self.users.get(name, User(name))
        scram = {m: make_credentials(m, password) for m in MECHANISMS}
        user = replace(old, scram=scram, roles=old.roles if roles is None else check_roles(roles))
        return Users({**self.users, name: user}, self.acls, self.with_salt_key().salt_key)

    def with_salt_key(self) -> Users:
        """This snapshot with a :attr:`salt_key` (a new random one if it had none)."""
        if self.salt_key:
            return self
        return replace(self, salt_key=secrets.token_bytes(SALT_KEY_BYTES))

    def with_access_key(self, name: str) -> tuple[Users, str, str]:
        """A new access key and secret for ``name``: (new snapshot, key, secret)."""
        user = self._existing(name)
        taken = {k for u in self.users.values() for k in u.access_keys}
        key = "AK" + secrets.token_hex(10).upper()
        while key in taken:
            key = "AK" + secrets.token_hex(10).upper()
        secret = secrets.token_urlsafe(30)
        user = replace(user, access_keys={**user.access_keys, key: secret})
        return replace(self, users={**self.users, name: user}), key, secret

    def without(self, name: str) -> Users:
        self._existing(name)
        return replace(self, users={n: u for n, u in self.users.items() if n != name})

    def with_acls(self, bindings: list[AclBinding]) -> Users:
        """These bindings added (each checked; one already there is not added twice)."""
        new = [check_binding(b) for b in bindings]
        have = set(self.acls)
        added = [b for b in dict.fromkeys(new) if b not in have]
        return replace(self, acls=(*self.acls, *added)) if added else self

    def without_acls(self, selected: AclFilter) -> tuple[Users, list[AclBinding]]:
        """(the snapshot without the bindings ``selected`` matches, those bindings)."""
        gone = [b for b in self.acls if selected.matches(b)]
        if not gone:
            return self, []
        return replace(self, acls=tuple(b for b in self.acls if not selected.matches(b))), gone

    def _existing(self, name: str) -> User:
        try:
            return self.users[name]
        except KeyError:
            raise ValueError(f"no user {name!r}") from None


@cache
def _placeholder_credentials(mechanism: str) -> ScramCredentials:
    """What a password is checked against when there is no credential to check it against
    (made once per process: only its cost matters, nothing can match it usefully)."""
    return make_credentials(mechanism, secrets.token_urlsafe(32),
                            iterations=UNKNOWN_USER_ITERATIONS)


def check_name(name: str) -> str:
    if not NAME.fullmatch(name):
        raise ValueError(f"user name {name!r}: 1-128 letters, digits, '.', '_', '@' or '-', "
                         f"starting with a letter or digit")
    return name


def check_roles(roles: tuple[str, ...] | list[str]) -> tuple[str, ...]:
    unknown = sorted(set(roles) - set(ROLES))
    if unknown:
        raise ValueError(f"unknown role(s) {', '.join(unknown)} (known: {', '.join(ROLES)})")
    return tuple(r for r in ROLES if r in roles)  # one order, no repeats


# --- the file's form (pure) ----------------------------------------------------------------------


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def encode_users(users: Users, *, indent: bool = True) -> bytes:
    doc: dict[str, Any] = {"version": FORMAT_VERSION if users.acls else 1, "users": {
        name: {
            "roles": list(u.roles),
            "scram": {m: {"salt": _b64(c.salt), "iterations": c.iterations,
                          "stored_key": _b64(c.stored_key), "server_key": _b64(c.server_key)}
                      for m, c in u.scram.items()},
            "access_keys": dict(u.access_keys),
        } for name, u in sorted(users.users.items())}}
    if users.salt_key:  # a key older brokers ignore
        doc["salt_key"] = _b64(users.salt_key)
    if users.acls:
        doc["acls"] = [{"resource_type": b.resource_type.name, "name": b.name,
                        "pattern": b.pattern.name, "principal": b.principal, "host": b.host,
                        "operation": b.operation.name, "permission": b.permission.name}
                       for b in users.acls]
    if not indent:  # etcd's copy: the same document, without the spaces
        return orjson.dumps(doc)
    return orjson.dumps(doc, option=orjson.OPT_INDENT_2) + b"\n"


def decode_users(data: bytes) -> Users:
    """The users of a file's bytes; ValueError (TypeError for a wrong shape) naming the entry
    for anything else."""
    try:
        doc = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise ValueError(f"not valid JSON: {exc}") from None
    if not isinstance(doc, dict) or doc.get("version") not in READABLE_VERSIONS:
        raise ValueError(f"not a users file of version 1 or {FORMAT_VERSION} "
                         f"(a JSON object with \"version\" and \"users\")")
    entries = doc.get("users")
    if not isinstance(entries, dict):
        raise TypeError("\"users\" must be an object of name -> user")
    users = {}
    seen_keys: set[str] = set()
    for name, entry in entries.items():
        try:
            user = _decode_user(name, entry)
        except (ValueError, TypeError, KeyError, binascii.Error) as exc:
            raise ValueError(f"user {name!r}: {exc}") from None
        again = seen_keys & set(user.access_keys)
        if again:
            raise ValueError(f"user {name!r}: access key {min(again)} belongs to two users")
        seen_keys |= set(user.access_keys)
        users[name] = user
    acls = doc.get("acls", []) if doc["version"] >= 2 else []
    if not isinstance(acls, list):
        raise TypeError("\"acls\" must be a list of ACL bindings")
    bindings = []
    for i, entry in enumerate(acls):
        try:
            bindings.append(_decode_binding(entry))
        except (ValueError, TypeError, KeyError) as exc:
            raise ValueError(f"acls[{i}]: {exc}") from None
    salt_key = doc.get("salt_key", "")
    if not isinstance(salt_key, str):
        raise TypeError("\"salt_key\" must be a base64 string")
    try:
        key = base64.b64decode(salt_key, validate=True)
    except binascii.Error:
        raise ValueError("\"salt_key\" is not base64") from None
    if salt_key and len(key) < 16:
        raise ValueError(f"\"salt_key\" of {len(key)} bytes (at least 16)")
    return Users(users, tuple(dict.fromkeys(bindings)), key)


def _decode_binding(entry: Any) -> AclBinding:
    if not isinstance(entry, dict) or not all(isinstance(entry.get(k), str) for k in (
            "resource_type", "name", "pattern", "principal", "host", "operation",
            "permission")):
        raise TypeError("must be an object of resource_type, name, pattern, principal, host, "
                        "operation and permission (strings)")
    def member(kind: Any, key: str) -> Any:
        try:
            return kind[entry[key]]
        except KeyError:
            raise ValueError(f"{key} {entry[key]!r} (known: "
                             f"{', '.join(m.name for m in kind)})") from None

    return check_binding(AclBinding(
        member(ResourceType, "resource_type"), entry["name"], member(PatternType, "pattern"),
        entry["principal"], entry["host"], member(AclOperation, "operation"),
        member(AclPermission, "permission")))


def _decode_user(name: str, entry: Any) -> User:
    check_name(name)
    if not isinstance(entry, dict):
        raise TypeError("must be an object with roles, scram and access_keys")
    roles = entry.get("roles", [])
    if not isinstance(roles, list) or not all(isinstance(r, str) for r in roles):
        raise TypeError("roles must be a list of role names")
    scram = {}
    for mechanism, c in dict(entry.get("scram", {})).items():
        if mechanism not in MECHANISMS:
            raise ValueError(f"unknown SCRAM mechanism {mechanism!r}")
        if not isinstance(c, dict) or not isinstance(c.get("iterations"), int):
            raise TypeError(f"{mechanism}: needs salt, iterations, stored_key and server_key")
        scram[mechanism] = ScramCredentials(
            mechanism, base64.b64decode(c["salt"], validate=True), c["iterations"],
            base64.b64decode(c["stored_key"], validate=True),
            base64.b64decode(c["server_key"], validate=True))
    keys = entry.get("access_keys", {})
    if not isinstance(keys, dict) or not all(isinstance(k, str) and isinstance(s, str) and k and s
                                             for k, s in keys.items()):
        raise TypeError("access_keys must be an object of access key -> secret key")
    return User(name, check_roles(roles), scram, keys)


# --- the file on disk ----------------------------------------------------------------------------


def load_users(path: str | os.PathLike[str], missing_ok: bool = False) -> Users:
    """Read and check the users file; :class:`UsersFileError` names the file and the fault."""
    try:
        data = Path(path).read_bytes()
    except FileNotFoundError:
        if missing_ok:
            return Users()
        raise UsersFileError(f"users file {path}: no such file "
                             f"(create it with 'txbroker user add')") from None
    except OSError as exc:
        raise UsersFileError(f"users file {path}: {exc.strerror or exc}") from None
    try:
        return decode_users(data)
    except (ValueError, TypeError) as exc:
        raise UsersFileError(f"users file {path}: {exc}") from None


def write_users(path: str | os.PathLike[str], users: Users) -> None:
    """Replace the file atomically; the new file is 0600 from its first byte."""
    target = Path(path)
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.fchmod(fd, 0o600)  # an old leftover keeps its mode through O_CREAT
        os.write(fd, encode_users(users))
        os.fsync(fd)
    except BaseException:
        os.close(fd)
        tmp.unlink(missing_ok=True)
        raise
    os.close(fd)
    os.replace(tmp, target)
    dir_fd = os.open(target.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


@contextmanager
def edit_users(path: str | os.PathLike[str]) -> Iterator[list[Users]]:
    """Read-modify-write under an exclusive lock (two ``txbroker user`` commands at once
    both land).  Yields a one-item list: put the new snapshot in it to have it written."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    lock_fd = os.open(target.with_name(f".{target.name}.lock"), os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(lock_fd, fcntl.LOCK_EX)
        before = load_users(target, missing_ok=True)
        box = [before]
        yield box
        if box[0] is not before:
            write_users(target, box[0])
    finally:
        os.close(lock_fd)


def _identity(path: Path) -> tuple[int, int, int] | None:
    try:
        st = path.stat()
    except OSError:
        return None
    return st.st_ino, st.st_size, st.st_mtime_ns


class UserSource(Protocol):
    """What a broker asks of its user store, the users file (:class:`UserStore`) or the
    cluster's store in etcd (``txbroker.cluster.user_keys.ClusterUsers``).  Event-loop only."""

    #: Where the users are, for messages ("users file PATH", "etcd KEY").
    where: str

    async def start(self) -> None:
        """The first read, before the broker serves (the file's was at construction)."""
        ...

    async def close(self) -> None: ...

    def current(self) -> Users:
        """The snapshot in force now (cheap: it sits on request paths)."""
        ...

    async def fresh(self) -> Users:
        """The store as it is now, read without waiting for the next check."""
        ...

    async def update(self, edit: Callable[[Users], tuple[Users, _T]]) -> _T:
        """Apply ``edit`` (pure: the snapshot before -> the snapshot after, an answer) to the
        store as it is, and return its answer once the store holds the result, which this
        broker's next request is decided on; :class:`UserStoreError` and nothing changed
        when the store did not take it."""
        ...

    def authorizer(self) -> Authorizer: ...

    def scram_credentials(self, user: str, mechanism: str) -> ScramCredentials | None: ...

    def check_password(self, user: str, password: str) -> bool: ...

    def salt_key(self) -> bytes:
        """The store's :attr:`Users.salt_key` now (empty when it has none)."""
        ...


class UserStore:
    """The users file as a running broker sees it: read at once, read again when it changes.

    Not thread-safe; call it from the event loop.  ``current()`` costs one ``stat`` per
    ``check_interval`` at most, so it can sit on a request path.
    """

    def __init__(self, path: str | os.PathLike[str], check_interval: float = 1.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.path = Path(path)
        self.check_interval = check_interval
        self._clock = clock
        self._seen = _identity(self.path)
        self._users = load_users(self.path)  # a bad file at start is the caller's error
        self._checked = clock()
        #: Times the file was read again after a change (successfully or not).
        self.reloads = 0
        self.where = f"users file {self.path}"

    def current(self) -> Users:
        now = self._clock()
        if now - self._checked < self.check_interval:
            return self._users
        self._checked = now
        seen = _identity(self.path)
        if seen == self._seen:
            return self._users
        self._seen = seen
        self.reloads += 1
        try:
            self._users = load_users(self.path)
        except UsersFileError as exc:
            log.error("%s; the previous users stay in force", exc)
        else:
            log.info("users file %s reloaded: %d user(s)", self.path, len(self._users.users))
        return self._users

    def refresh(self) -> Users:
        """The file as it is now, looked at without waiting for ``check_interval`` (after an
        edit this broker made: its next request is decided on the edit)."""
        self._checked = self._clock() - self.check_interval
        return self.current()

    async def start(self) -> None:
        """Read at construction (a bad file stops the start before anything binds); a file
        with users but no ``salt_key`` (written before there was one) gets one now, so
        made-up salts stay the same after a restart."""
        if self._users.users and not self._users.salt_key:
            try:
                await self.update(lambda users: (users.with_salt_key(), None))
            except UserStoreError as exc:
                log.warning("%s: no salt_key written (%s); unknown users' SCRAM salts change "
                            "at each restart until one is", self.where, exc)

    async def close(self) -> None:
        pass

    async def fresh(self) -> Users:
        return self.refresh()

    async def update(self, edit: Callable[[Users], tuple[Users, _T]]) -> _T:
        """``edit`` through :func:`edit_users` (the lock, the atomic rename), in the default
        executor since that is blocking file work; then the file is read at once."""
        def run() -> _T:
            with edit_users(self.path) as box:
                box[0], answer = edit(box[0])
            return answer
        try:
            answer = await asyncio.get_running_loop().run_in_executor(None, run)
        except (UsersFileError, OSError) as exc:
            raise UserStoreError(f"{self.where}: {exc}") from exc
        self.refresh()
        return answer

    def authorizer(self) -> Authorizer:
        """The Kafka ACL decision on the file as it is now."""
        return self.current().authorizer

    def scram_credentials(self, user: str, mechanism: str) -> ScramCredentials | None:
        """The SASL/SCRAM server's lookup, on the file as it is now."""
        return self.current().scram_credentials(user, mechanism)

    def check_password(self, user: str, password: str) -> bool:
        """The SASL/PLAIN server's check, on the file as it is now."""
        return self.current().check_password(user, password)

    def salt_key(self) -> bytes:
        return self.current().salt_key
