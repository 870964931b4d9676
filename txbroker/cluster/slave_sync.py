"""What a slave copies from its master besides the commitlog: topic configs (classic and
controller mode).

Topics live in a file of their own on the master, so a slave asks for them with an ordinary
remoting request every ``metadata_sync_interval`` (RocketMQ's SlaveSynchronize:
GET_ALL_TOPIC_CONFIG 21, docs/cluster.md "Metadata sync") and replaces its table when they
differ.  In etcd mode topics come from etcd instead (:mod:`txbroker.cluster.topic_keys`) and
nothing is copied.  Consumer offsets are not copied: they are records of the commitlog
(:mod:`txbroker.store.offset_log`), replicated with it and applied on the slave as on the
master.

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


class SlaveSync:
    """Copies topics from the master while this broker is a slave."""

    def __init__(self, topics: TopicManager, interval: float,
                 master_addr: Callable[[], str | None],
                 credentials: SessionCredentials | None = None,
                 tls: ssl.SSLContext | None = None) -> None:
        self.topics = topics
        self.credentials = credentials
        #: TLS to the master's broker port (the broker's ``tls_peers``), None: plaintext.
        self.tls = tls
        #: Why the last round failed (None: it worked, or none ran yet).
        self.problem: str | None = None
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
        topics = await self._ask(RequestCode.GET_ALL_TOPIC_CONFIG, addr)
        await self.topics.replace_all(parse_topic_table(topics))
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
