"""Topic configuration: which topics exist, how many queues they have, and who may write them.

Topics are created on demand (RocketMQ's ``autoCreateTopicEnable``) or by the admin request
UPDATE_AND_CREATE_TOPIC, and persisted to ``<data_dir>/config/topics.json`` with an atomic
rename so a crash never leaves a half-written file.  The write (with its fsync) runs in the
default executor, never on the event loop, and a change shows in memory only once the file
holds it: a change the file cannot take (a full disk) is refused and never seen.  Names follow
Kafka's rule, for both protocols (``[a-zA-Z0-9._-]``, 1 to 249 characters, not ``.`` or
``..``), plus RocketMQ's own separators ``%`` (the ``%RETRY%``/``%DLQ%`` prefixes, namespaces)
and ``|``: one rule, :func:`txbroker.store.record.topic_name_problem`, which the SDK and CLI
check too.  Stock RocketMQ clients check their own, stricter rule (no ``.``, at most 127)
before they send (docs/protocol.md §8.1).  System topics hold broker-internal state (half and
operation messages, discarded halves, scheduled messages): a client may never produce to them
or delete them, otherwise it could forge a commit or hide a pending transaction.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import cast

import orjson

from txbroker.config import BrokerConfig
from txbroker.remoting.bodies import DataVersion
from txbroker.remoting.codes import ResponseCode
from txbroker.remoting.errors import Refusal
from txbroker.store.record import (
    CHECK_MAX_TIME_TOPIC,
    DEFAULT_TOPIC,
    DLQ_GROUP_TOPIC_PREFIX,
    GROUP_NAME_RE,
    HALF_TOPIC,
    MAX_TOPIC_BYTES,
    OP_HALF_TOPIC,
    RETRY_GROUP_TOPIC_PREFIX,
    topic_name_problem,
)

#: Where scheduled (delayed) messages wait; RocketMQ's name, so operators recognise it.
SCHEDULE_TOPIC = "SCHEDULE_TOPIC_XXXX"
#: Where timer messages wait (RocketMQ 5's name): queue 0 the timers, queue 1 the settle
#: records (delivered or recalled; txbroker.service.timer).
TIMER_TOPIC = "rmq_sys_wheel_timer"

log = logging.getLogger(__name__)

PERM_INHERIT = 0x1
PERM_WRITE = 0x2
PERM_READ = 0x4
PERM_READ_WRITE = PERM_READ | PERM_WRITE

#: Internal topics with a fixed queue count (the half topic uses queue 0 only, by design).
_SYSTEM_QUEUES = {HALF_TOPIC: 1, OP_HALF_TOPIC: 1, CHECK_MAX_TIME_TOPIC: 1, SCHEDULE_TOPIC: 18,
                  TIMER_TOPIC: 2}


class TopicError(Refusal):
    """A topic request the broker refuses; ``code`` is the RocketMQ response code to send."""


class TopicStoreError(TopicError):
    """The topic change could not be persisted (a full disk): nothing changed, say why."""


class NotGroupMaster(TopicStoreError):
    """etcd mode: topic changes are the group's master's (this broker is a slave now)."""


@dataclass(frozen=True)
class TopicConfig:
    name: str
    read_queue_nums: int
    write_queue_nums: int
    perm: int = PERM_READ_WRITE
    topic_sys_flag: int = 0
    order: bool = False
    #: Kafka's ``retention.ms`` set on this topic; -1 = the broker's ``file_reserved_time``.
    #: Shorter than that only (the commitlog is shared, docs/kafka.md "Admin APIs").
    retention_ms: int = -1

    def to_wire(self) -> dict:
        """RocketMQ's ``TopicConfig`` JSON shape (GET_ALL_TOPIC_CONFIG, dashboards)."""
        return {
            "topicName": self.name, "readQueueNums": self.read_queue_nums,
            "writeQueueNums": self.write_queue_nums, "perm": self.perm,
            "topicFilterType": "SINGLE_TAG", "topicSysFlag": self.topic_sys_flag,
            "order": self.order,
        }


def validate_topic_name(name: str | None) -> str:
    """The name if it is a topic name here, else :class:`TopicError` (MESSAGE_ILLEGAL) saying
    why, in Kafka's words (the rule is :func:`txbroker.store.record.topic_name_problem`, which
    the SDK and CLI check too)."""
    problem = topic_name_problem(name)
    if problem is not None:
        raise TopicError(ResponseCode.MESSAGE_ILLEGAL, problem)
    return cast(str, name)  # topic_name_problem passes only a non-empty str


def validate_group_name(name: str | None, what: str = "group") -> str:
    """Groups follow the topic rules: they become part of %RETRY%/%DLQ% topic names."""
    if not name:
        raise TopicError(ResponseCode.SYSTEM_ERROR, f"{what} name is empty")
    if len(name) + len(RETRY_GROUP_TOPIC_PREFIX) > MAX_TOPIC_BYTES or not GROUP_NAME_RE.match(name):
        raise TopicError(ResponseCode.SYSTEM_ERROR,
                         f"{what} name {name!r} is invalid (charset [%|a-zA-Z0-9_-], "
                         f"at most {MAX_TOPIC_BYTES - len(RETRY_GROUP_TOPIC_PREFIX)} characters)")
    return name


def is_system_topic(name: str) -> bool:
    """Broker-internal topics: never produced to, deleted or redefined by a client."""
    return name.startswith("RMQ_SYS_") or name in _SYSTEM_QUEUES


def is_protected_topic(name: str, config: BrokerConfig) -> bool:
    """Topics a client may not delete or redefine (system topics plus the template topic)."""
    return is_system_topic(name) or name in (DEFAULT_TOPIC, config.cluster_name, config.broker_name)


def _builtin_names() -> frozenset[str]:
    """Topics every broker makes for itself at start (:meth:`TopicManager._ensure_builtin`)."""
    return frozenset({DEFAULT_TOPIC, *_SYSTEM_QUEUES})


class TopicManager:
    """All topic configs of this broker.  Used from the event loop only; changes are made one
    at a time (an asyncio lock held across the write), so two writes of the file never overlap
    and each one holds every change before it."""

    def __init__(self, config: BrokerConfig) -> None:
        self.config = config
        self.path = Path(config.data_dir) / "config" / "topics.json"
        self._topics: dict[str, TopicConfig] = {}
        self._changing = asyncio.Lock()
        #: Bumped on every change: name servers apply a registered table only when it moved.
        self.data_version = DataVersion(int(time.time() * 1000), 0)
        self._listeners: list[Callable[[], None]] = []
        #: etcd mode: where a change goes before the file and memory take it (raises
        #: :class:`TopicStoreError` when it is refused: nothing changes); None = the file only.
        self.publisher: Callable[[str, TopicConfig | None], Awaitable[None]] | None = None
        self._load()
        self._ensure_builtin()

    # --- persistence --------------------------------------------------------------------
    def _load(self) -> None:
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            return
        doc = orjson.loads(raw) if raw.strip() else {}
        for entry in doc.get("topics", []):
            tc = TopicConfig(**entry)
            self._topics[tc.name] = tc

    async def _commit(self, name: str, tc: TopicConfig | None) -> None:
        """Make ``name`` hold ``tc`` (None: deleted); the caller holds ``_changing``.

        The new table is written first, off the loop, and memory changes only once the file
        holds it, so memory never holds a topic the file does not (a restart would lose it).
        A caller cancelled meanwhile waits for the write to end (the next one must not overlap
        it) and leaves memory as it was: the file may then lead memory, never lag it."""
        table = dict(self._topics)
        if tc is None:
            table.pop(name, None)
        else:
            table[name] = tc
        if self.publisher is not None:
            await self.publisher(name, tc)
        try:
            await self._write_off_loop(table)
        except OSError as exc:
            raise TopicStoreError(ResponseCode.SERVICE_NOT_AVAILABLE,
                                  f"topic[{name}] not changed: cannot write the topic table: "
                                  f"{exc.strerror or exc}") from exc
        self._topics = table
        self._changed()

    async def _write_off_loop(self, table: dict[str, TopicConfig]) -> None:
        """:meth:`_write` in the executor; a cancelled caller still waits for the write."""
        fut = asyncio.get_running_loop().run_in_executor(None, self._write, table)
        try:
            await asyncio.shield(fut)
        except asyncio.CancelledError:
            await asyncio.wait([fut])
            raise

    def _changed(self) -> None:
        """The table changed: a new data version, and the listeners are told."""
        self.data_version = DataVersion(int(time.time() * 1000), self.data_version.counter + 1)
        for listener in self._listeners:
            listener()

    def add_listener(self, fn: Callable[[], None]) -> None:
        """Call ``fn()`` after every change (the broker re-registers with its name servers)."""
        self._listeners.append(fn)

    def _write(self, table: dict[str, TopicConfig]) -> None:
        """Blocking (the executor, or start-up): temp file, fsync, rename over the table."""
        doc = {"topics": [asdict(t) for t in sorted(table.values(), key=lambda t: t.name)]}
        tmp = self.path.with_suffix(".tmp")
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with open(tmp, "wb") as fh:
                fh.write(orjson.dumps(doc, option=orjson.OPT_INDENT_2))
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, self.path)
        except OSError:
            tmp.unlink(missing_ok=True)
            raise

    def _ensure_builtin(self) -> None:
        changed = False
        n = self.config.default_queue_nums
        builtin = {DEFAULT_TOPIC: TopicConfig(DEFAULT_TOPIC, n, n, PERM_READ_WRITE | PERM_INHERIT)}
        for name, q in _SYSTEM_QUEUES.items():
            builtin[name] = TopicConfig(name, q, q)
        for name, tc in builtin.items():
            if name not in self._topics:
                self._topics[name] = tc
                changed = True
        if changed:
            try:
                self._write(self._topics)
            except OSError as exc:  # built-ins are added again at every start: serve reads
                log.warning("cannot write the topic table %s: %s", self.path, exc)

    # --- queries ------------------------------------------------------------------------
    def get(self, name: str) -> TopicConfig | None:
        return self._topics.get(name)

    def all(self) -> list[TopicConfig]:
        return sorted(self._topics.values(), key=lambda t: t.name)

    def names(self) -> list[str]:
        return sorted(self._topics)

    # --- changes ------------------------------------------------------------------------
    async def get_or_create(self, name: str, *, queue_nums: int | None = None,
                            auto_create: bool | None = None) -> TopicConfig:
        """The topic's config, creating it when allowed.

        Retry and dead-letter topics are always created (with one queue, as RocketMQ does):
        the broker itself writes them on a consumer's behalf.  Other topics follow
        ``auto_create_topic``; refusal is TOPIC_NOT_EXIST.
        """
        tc = self._topics.get(name)
        if tc is not None:
            return tc
        validate_topic_name(name)
        if name.startswith((RETRY_GROUP_TOPIC_PREFIX, DLQ_GROUP_TOPIC_PREFIX)):
            n = 1
        else:
            allowed = self.config.auto_create_topic if auto_create is None else auto_create
            if not allowed:
                raise TopicError(ResponseCode.TOPIC_NOT_EXIST,
                                 f"topic[{name}] not exist, apply first please!")
            if is_system_topic(name):
                raise TopicError(ResponseCode.NO_PERMISSION, f"topic[{name}] is a system topic")
            # Like RocketMQ, a client's defaultTopicQueueNums is capped by the broker's default.
            n = self.config.default_queue_nums
            if queue_nums is not None and queue_nums > 0:
                n = min(queue_nums, n)
        async with self._changing:
            tc = self._topics.get(name)  # another request may have created it meanwhile
            if tc is None:
                tc = TopicConfig(name, n, n)
                await self._commit(name, tc)
                # Logged: a misspelt topic in a producer is otherwise created without a trace.
                log.info("created topic %r with %d queues on its first use", name, n)
        return tc

    async def create_or_update(self, tc: TopicConfig) -> TopicConfig:
        """UPDATE_AND_CREATE_TOPIC: validated, never for protected topics."""
        validate_topic_name(tc.name)
        if is_protected_topic(tc.name, self.config):
            raise TopicError(ResponseCode.NO_PERMISSION,
                             f"topic[{tc.name}] is a system topic and cannot be changed")
        for label, n in (("readQueueNums", tc.read_queue_nums), ("writeQueueNums", tc.write_queue_nums)):
            if not 1 <= n <= 1024:
                raise TopicError(ResponseCode.SYSTEM_ERROR, f"{label}={n}: must be 1..1024")
        if not 0 <= tc.perm <= 0xF:
            raise TopicError(ResponseCode.SYSTEM_ERROR, f"perm={tc.perm}: must be 0..15")
        async with self._changing:
            await self._commit(tc.name, tc)
        return tc

    async def delete(self, name: str) -> bool:
        if is_protected_topic(name, self.config):
            raise TopicError(ResponseCode.NO_PERMISSION, f"topic[{name}] is a system topic")
        async with self._changing:
            existed = name in self._topics
            if existed:
                await self._commit(name, None)
        return existed

    def own(self) -> list[TopicConfig]:
        """The topics this broker was told to have: all but the built-in ones."""
        return [tc for name, tc in sorted(self._topics.items()) if name not in _builtin_names()]

    async def replace_replicated(self, configs: list[TopicConfig]) -> bool:
        """etcd mode: take the group's table (built-in topics stay this broker's own)."""
        builtin = {name: tc for name, tc in self._topics.items() if name in _builtin_names()}
        return await self.replace_all([*builtin.values(), *configs])

    async def replace_all(self, configs: list[TopicConfig]) -> bool:
        """Take another broker's table whole (a slave copying its master's, docs/cluster.md);
        False when it holds nothing new.  Like every change, memory follows the file."""
        table = {tc.name: tc for tc in configs}
        async with self._changing:
            if table == self._topics:
                return False
            await self._write_off_loop(table)
            self._topics = table
            self._changed()
        return True
