"""The cluster's users, roles, access keys and Kafka ACL bindings in etcd, one store for every
broker of every group (docs/security.md "Users", docs/cluster.md "Consensus on etcd").

Without this, each broker read its own users file: a Kafka ACL created through one group's
broker (CreateAcls edits the file of the broker that answers) did not exist on the others,
and a user added on one machine could not log in on the next.  In etcd mode:

* the whole store is **one document**, ``<etcd_prefix>/<cluster>/users``: the users file's
  JSON (``encode_users``, without the spaces).  One document rather than a key per user and
  per binding because the store's rules span entries: an access key belongs to one user of
  all, a binding is stored once, a user and the bindings an edit adds change together.  A
  change is the pure edit of ``service/users.py`` applied to the document as read, written
  back in one transaction that compares the document's mod revision with the one read (a
  compare-and-swap): two brokers or commands editing at once both land, the second applied
  to the first's result after one more read.  The price is a size bound: etcd takes values
  up to ``MAX_VALUE_SIZE`` (1 MiB), some 2,500 users or 5,000 bindings;
* a change is acknowledged (CreateAcls, DeleteAcls, ``txbroker user`` / ``acl``) only once
  etcd took it; one etcd did not take is an error answer and nothing changed.  A transaction
  whose answer was lost is looked for by a read (the document holding exactly what was
  written means it landed); only when that read fails too is the change answered as an
  error although it may have landed, and then every broker still sees the same store;
* every broker reads the document at start and then **polls it once a second** (one
  linearizable read of one key; the value only when its mod revision moved).  A poll rather
  than an etcd watch: it needs nothing the client does not already do (endpoint fail-over
  within one call, no stream to re-establish, no compacted revision to recover from), and a
  second is the bound it gives: a change is in force on the broker that made it when it
  answers, and on every other broker within ``POLL_INTERVAL`` (plus one etcd read) after.
  DescribeAcls reads etcd before answering;
* **the import**: the first broker to find neither the document nor ``users-imported``
  writes its users file's content (an existing file, maybe without users) as the document, with ``users-imported``, in
  one transaction that requires both absent.  So a cluster moving to etcd keeps its users and
  bindings, and no later broker's file brings back a user or binding deleted since.

A document that does not decode leaves the previous users in force, with one error line.
The document holds access keys' secrets as the users file does (RocketMQ's signature is an
HMAC keyed with them): etcd's own authentication and TLS are what keep it private.
Event-loop only.
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
from collections.abc import Callable
from typing import TypeVar

import orjson

from txbroker.cluster.etcd import KV, Etcd, EtcdError, compare_create, compare_mod, put
from txbroker.config import BrokerConfig
from txbroker.service.kafka.acls import Authorizer
from txbroker.service.repeating import Repeating
from txbroker.service.scram import ScramCredentials
from txbroker.service.users import (
    Users,
    UsersFileError,
    UserStoreError,
    decode_users,
    encode_users,
    load_users,
)

log = logging.getLogger(__name__)

#: Seconds between two reads of the document by a broker: the longest a change made through
#: another broker or a command waits to be in force here.
POLL_INTERVAL = 1.0
#: Times an edit is applied again after another edit landed between its read and its write
#: (edits of one broker go one at a time, so only other brokers and commands race it).
EDIT_ATTEMPTS = 8
#: Longest pause, seconds, before an edit that lost such a race reads again.
RETRY_PAUSE = 0.05

_T = TypeVar("_T")


def users_key(prefix: str, cluster: str) -> bytes:
    """The document's key: beside the groups' keys, not under any of them."""
    return f"{prefix.rstrip('/')}/{cluster}/users".encode()


def imported_key(prefix: str, cluster: str) -> bytes:
    return f"{prefix.rstrip('/')}/{cluster}/users-imported".encode()


def _decode(kv: KV) -> Users:
    try:
        return decode_users(kv.value)
    except (ValueError, TypeError) as exc:
        raise UsersFileError(f"etcd key {kv.key.decode(errors='replace')}: {exc}") from None


class EtcdUsers:
    """The document and its edits, on one etcd client (the broker's store and the CLI's)."""

    def __init__(self, etcd: Etcd, prefix: str, cluster: str) -> None:
        self.etcd = etcd
        self.key = users_key(prefix, cluster)
        self.marker = imported_key(prefix, cluster)
        self.where = f"etcd {self.key.decode()}"

    async def read(self) -> tuple[Users, int]:
        """The store now (a linearizable read) and the document's mod revision (0: none
        yet, an empty store)."""
        kv = await self.etcd.get(self.key)
        if kv is None:
            return Users(), 0
        return _decode(kv), kv.mod_revision

    async def edit(self, edit: Callable[[Users], tuple[Users, _T]]) -> tuple[_T, Users, int]:
        """Apply ``edit`` to the store as etcd holds it and write the result in one
        transaction guarded by the document's mod revision, again on a fresh read when
        another edit landed first: (the edit's answer, the store now, its mod revision).
        :class:`UserStoreError` (nothing changed) when etcd does not take it."""
        try:
            for _ in range(EDIT_ATTEMPTS):
                before, revision = await self.read()
                after, answer = edit(before)
                if after is before:  # nothing to write (e.g. a binding already there)
                    return answer, before, revision
                data = encode_users(after, indent=False)
                ops = [put(self.key, data)]
                if revision == 0:  # the first write makes the store: no import after it
                    ops.append(put(self.marker, orjson.dumps({"from": "an edit"})))
                try:
                    result = await self.etcd.txn([compare_mod(self.key, revision)], ops)
                except EtcdError:
                    # The answer may be lost after etcd applied it: look before saying no.
                    kv = await self.etcd.get(self.key)
                    if kv is not None and kv.value == data:
                        return answer, after, kv.mod_revision
                    raise
                if result.succeeded:
                    return answer, after, result.revision
                # Another edit landed between the read and the write: read again after a
                # random pause, so edits racing from several brokers do not keep colliding.
                await asyncio.sleep(random.uniform(0, RETRY_PAUSE))
        except (EtcdError, UsersFileError) as exc:
            raise UserStoreError(f"{self.where}: not changed: {exc}") from exc
        raise UserStoreError(f"{self.where}: not changed: {EDIT_ATTEMPTS} other edits landed "
                             f"first, try again")

    async def import_file(self, users: Users, source: str) -> bool:
        """Make ``users`` the store if it was never made (neither the document nor
        ``users-imported`` exist), in one transaction; whether it did."""
        result = await self.etcd.txn(
            [compare_create(self.key, 0), compare_create(self.marker, 0)],
            [put(self.key, encode_users(users, indent=False)),
             put(self.marker, orjson.dumps({"from": source, "users": len(users.users),
                                            "acls": len(users.acls)}))])
        return result.succeeded


class ClusterUsers:
    """The cluster's user store as one broker sees it: read at start, polled each
    ``POLL_INTERVAL``, written through etcd (:class:`~txbroker.service.users.UserSource`)."""

    def __init__(self, config: BrokerConfig, *, interval: float = POLL_INTERVAL) -> None:
        from txbroker.cluster.leadership import etcd_client

        self.config = config
        self.etcd = etcd_client(config, timeout=max(1.0, config.etcd_lease / 6))
        self.doc = EtcdUsers(self.etcd, config.etcd_prefix, config.cluster_name)
        self.where = self.doc.where
        self._users = Users()
        #: The mod revision of the document ``_users`` came from (0: none read yet).
        self._revision = -1
        #: The users file to import, read at construction (a bad file stops the start; a
        #: missing one is nothing to import, so it cannot make the store empty for good).
        self._file: Users | None = None
        if config.users_file is not None and os.path.exists(config.users_file):
            self._file = load_users(config.users_file)
        #: Edits through this broker go one at a time (no race among themselves).
        self._editing = asyncio.Lock()
        self._polls = Repeating(self.pull, interval, what=f"reading users from {self.where}",
                                errors=(EtcdError, UsersFileError))

    async def start(self) -> None:
        """The first read (with the import when the store was never made), then the polls.
        An etcd away at start leaves the store empty (every login and every ACL refused)
        until a poll reads it."""
        try:
            await self.pull()
        except (EtcdError, UsersFileError) as exc:
            log.warning("users not read from %s yet (logins and Kafka ACLs refuse until they "
                        "are): %s", self.where, exc)
        if self._users.users and not self._users.salt_key:
            # A store written before there was a salt key gets one, once for the cluster (the
            # edit is guarded by the document's revision; a broker that finds one keeps it).
            try:
                await self.update(lambda users: (users.with_salt_key(), None))
            except UserStoreError as exc:
                log.warning("%s: no salt_key written (%s); unknown users' SCRAM salts are "
                            "keyed by cluster_secret, or change at each restart without one",
                            self.where, exc)
        self._polls.start()

    async def close(self) -> None:
        await self._polls.close()
        await self.etcd.close()

    async def pull(self) -> None:
        """Take the document when it changed; import the users file when there is none."""
        kv = await self.etcd.get(self.doc.key)
        if kv is None:
            source = (f"{self.config.broker_name}:{self.config.broker_id} "
                      f"{os.path.basename(str(self.config.users_file))}")
            if self._file is not None and self._revision <= 0 \
                    and await self.doc.import_file(self._file, source):
                log.warning("%s: imported %d user(s) and %d Kafka ACL binding(s) from users "
                            "file %s; that file is no longer read", self.where,
                            len(self._file.users), len(self._file.acls), self.config.users_file)
                kv = await self.etcd.get(self.doc.key)
            if kv is None:
                self._take(Users(), 0)
                return
        if kv.mod_revision != self._revision:
            if self._revision < 0 and self._file is not None and (self._file.users
                                                                  or self._file.acls):
                log.warning("users file %s not imported: the cluster's users are in %s "
                            "already (that file is no longer read)", self.config.users_file,
                            self.where)
            self._take(_decode(kv), kv.mod_revision)

    def _take(self, users: Users, revision: int) -> None:
        if revision < self._revision and revision != 0:
            return  # an older read than the one in force (an edit's result came first)
        if revision != self._revision:
            log.info("users from %s: %d user(s), %d Kafka ACL binding(s)", self.where,
                     len(users.users), len(users.acls))
        self._users, self._revision = users, revision

    # --- UserSource ------------------------------------------------------------------------
    def current(self) -> Users:
        return self._users

    async def fresh(self) -> Users:
        try:
            users, revision = await self.doc.read()
        except (EtcdError, UsersFileError) as exc:
            raise UserStoreError(f"{self.where}: {exc}") from exc
        self._take(users, revision)
        return self._users

    async def update(self, edit: Callable[[Users], tuple[Users, _T]]) -> _T:
        async with self._editing:
            answer, users, revision = await self.doc.edit(edit)
        self._take(users, revision)
        return answer

    def authorizer(self) -> Authorizer:
        return self._users.authorizer

    def scram_credentials(self, user: str, mechanism: str) -> ScramCredentials | None:
        return self._users.scram_credentials(user, mechanism)

    def check_password(self, user: str, password: str) -> bool:
        return self._users.check_password(user, password)

    def salt_key(self) -> bytes:
        return self._users.salt_key
