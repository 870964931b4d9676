"""What a slave copies from its master besides the commitlog: topic configs and consumer offsets.

The commitlog stream (HA) carries messages only.  Topics and consumer offsets live in files of
their own on the master, so a slave asks for them with ordinary remoting requests every
``metadata_sync_interval`` (RocketMQ's SlaveSynchronize: GET_ALL_TOPIC_CONFIG 21 and
GET_ALL_CONSUMER_OFFSET 43, docs/cluster.md "Metadata sync").  Topics replace the slave's table
when they differ; offsets are merged (an offset is never moved back by a sync, and one the
master no longer has is kept), each with the Kafka commit metadata and time the master holds
for it (so OffsetFetch answers the same metadata after a failover), so a promoted slave resumes consumers where the master last
reported them, at most one interval behind: a consumer may see up to that much again after a
failover, never miss anything.  In etcd mode topics come from etcd instead
(:mod:`txbroker.cluster.topic_keys`), so only offsets are copied here (``copy_topics=False``).

Under access control the master checks these requests like any other, so a slave signs them
with its own ACL account (``acl_access_key``; RocketMQ 5 signs broker-to-broker calls with its
``innerClientAuthenticationCredentials`` the same way), over TLS when the broker dials its
peers with TLS (``tls_peers``).  A failing round is logged once per
cause (a refusal's remark names it) and kept in :attr:`SlaveSync.problem` until a round works.
"""

from __future__ import annotations

import logging
import ssl
from collections.abc import Callable

import orjson

from txbroker.remoting.client import RemotingClient
from txbroker.remoting.codes import RequestCode, ResponseCode
from txbroker.remoting.command import RemotingCommand
from txbroker.remoting.signing import SessionCredentials
from txbroker.remoting.tls import link_failure
from txbroker.service.repeating import Repeating
from txbroker.service.topics import TopicConfig, TopicManager
from txbroker.store.offsets import ConsumerOffsetStore, KafkaCommit

log = logging.getLogger(__name__)

#: One request's time-out (RocketMQ: 3 s).
SYNC_TIMEOUT = 3.0


def parse_topic_table(body: bytes) -> list[TopicConfig]:
    """A GET_ALL_TOPIC_CONFIG body → topic configs (TypeError, ValueError or KeyError when
    it is not one)."""
    doc = orjson.loads(body)
    table = doc.get("topicConfigTable")
    if not isinstance(table, dict):
        raise TypeError("no topicConfigTable")
    out = []
    for name, tc in table.items():
        out.append(TopicConfig(str(tc.get("topicName", name)), int(tc["readQueueNums"]),
                               int(tc["writeQueueNums"]), int(tc.get("perm", 6)),
                               int(tc.get("topicSysFlag", 0)), bool(tc.get("order", False))))
    return out


def parse_offset_table(body: bytes) -> list[tuple[str, str, int, int, KafkaCommit | None]]:
    """A GET_ALL_CONSUMER_OFFSET body → (group, topic, queue id, offset, Kafka commit) rows;
    the Kafka commit (metadata, commit time ms) comes from ``kafkaCommitTable``, which a
    RocketMQ broker does not send (None then)."""
    doc = orjson.loads(body)
    table = doc.get("offsetTable")
    if not isinstance(table, dict):
        raise TypeError("no offsetTable")
    kafka = doc.get("kafkaCommitTable") or {}
    if not isinstance(kafka, dict):
        raise TypeError("kafkaCommitTable is not an object")
    rows = []
    for key, queues in table.items():
        topic, sep, group = str(key).rpartition("@")
        if not sep:
            raise ValueError(f"offset key {key!r} is not topic@group")
        commits = kafka.get(key) or {}
        for qid, offset in queues.items():
            commit = commits.get(qid)
            rows.append((group, topic, int(qid), int(offset),
                         None if commit is None else (str(commit[0]), int(commit[1]))))
    return rows


class SlaveSync:
    """Copies topics and consumer offsets from the master while this broker is a slave."""

    def __init__(self, topics: TopicManager, offsets: ConsumerOffsetStore, interval: float,
                 master_addr: Callable[[], str | None],
                 credentials: SessionCredentials | None = None,
                 tls: ssl.SSLContext | None = None, copy_topics: bool = True) -> None:
        self.topics = topics
        self.copy_topics = copy_topics
        self.credentials = credentials
        #: TLS to the master's broker port (the broker's ``tls_peers``), None: plaintext.
        self.tls = tls
        #: Why the last round failed (None: it worked, or none ran yet).
        self.problem: str | None = None
        self.offsets = offsets
        self.interval = interval
        self._master_addr = master_addr
        self._client: RemotingClient | None = None
        self._rounds = Repeating(self._round, interval, what="metadata sync from the master",
                                 errors=())

    def start(self) -> None:
        self._rounds.start()

    async def close(self) -> None:
        await self._rounds.close()
        if self._client is not None:
            await self._client.close()
            self._client = None

    async def _round(self) -> None:
        """One round for the background loop: a failure is logged when its cause is new."""
        try:
            await self.sync_once()
        except (OSError, TimeoutError, ValueError, KeyError, TypeError) as exc:
            why = link_failure(exc)
            if why != self.problem:
                log.warning("metadata sync from the master failed: %s", why)
            self.problem = why
            return
        if self.problem is not None:
            log.info("metadata sync from the master works again")
        self.problem = None

    async def sync_once(self) -> bool:
        """One round; False when no master address is known yet."""
        addr = self._master_addr()
        if not addr:
            return False
        if self._client is None or self._client.addr != addr:
            if self._client is not None:
                await self._client.close()
            self._client = RemotingClient(addr, connect_timeout=SYNC_TIMEOUT, ssl=self.tls)
        if self.copy_topics:
            topics = await self._ask(RequestCode.GET_ALL_TOPIC_CONFIG, addr)
            await self.topics.replace_all(parse_topic_table(topics))
        offsets = await self._ask(RequestCode.GET_ALL_CONSUMER_OFFSET, addr)
        for group, topic, qid, offset, commit in parse_offset_table(offsets):
            have = self.offsets.get(group, topic, qid)
            if have is None or offset > have or (
                    offset == have and commit != self.offsets.kafka_commit(group, topic, qid)):
                self.offsets.set(group, topic, qid, offset, kafka=commit)
        return True

    async def _ask(self, code: int, addr: str) -> bytes:
        assert self._client is not None
        request = RemotingCommand.request(code)
        if self.credentials is not None:
            self.credentials.sign(request)
        resp = await self._client.invoke(request, SYNC_TIMEOUT)
        if resp.code != ResponseCode.SUCCESS:
            raise ValueError(f"master {addr} answered {code} with {resp.code}: {resp.remark or ''}")
        return resp.body or b"{}"
