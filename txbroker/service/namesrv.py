"""The embedded name server: routes for topics, cluster info, the topic list.

A RocketMQ client needs *some* address answering GET_ROUTEINFO_BY_TOPIC; the route may point
the broker at that same address (docs/protocol.md §8.4).  txbroker is a
single broker, so the name server is a view over its own topic table rather than a registry of
brokers: one port is a complete installation.  The handlers are registered on the name-server
port and on the broker port alike.

A route lookup never creates a topic: an unknown topic answers TOPIC_NOT_EXIST, as RocketMQ's
name server does, so a consumer subscribing to a misspelt name is told so instead of leaving a
new empty topic behind.  A producer's send still creates its topic when the broker allows
auto-creation: like RocketMQ's clients it falls back to the route of the template topic
``TBW102``, which is answered only while ``auto_create_topic`` is on, and the SEND then creates
the topic (``SendProcessor``).

Route bodies come in two dialects.  Old clients get fastjson's default output, whose
``brokerAddrs`` map has *unquoted* numeric keys (``{0:"127.0.0.1:10911"}``); clients at
version >= V4_9_4 (401), or that send ``acceptStandardJsonOnly=true``, get standard JSON
(docs/protocol.md §4.9).  Both dialects sort keys, as fastjson does.  The request header is a
``GetRouteInfoRequestHeader`` and the answers are written by ``remoting.bodies``
(``TopicRouteData``, ``ClusterInfo``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import orjson

from txbroker.config import BrokerConfig
from txbroker.remoting.bodies import (
    MASTER_ID,
    BrokerData,
    ClusterInfo,
    QueueData,
    TopicRouteData,
    wants_standard_json,
)
from txbroker.remoting.codes import RequestCode, ResponseCode
from txbroker.remoting.command import RemotingCommand
from txbroker.remoting.errors import Refusal
from txbroker.remoting.headers import GetRouteInfoRequestHeader
from txbroker.service.topics import PERM_READ_WRITE, TopicManager
from txbroker.store.record import DEFAULT_TOPIC

log = logging.getLogger(__name__)

class NameServer:
    """Answers name-server requests from the broker's own topic table."""

    def __init__(self, config: BrokerConfig, topics: TopicManager,
                 broker_addr: Callable[[], str]) -> None:
        self.config = config
        self.topics = topics
        self._broker_addr = broker_addr

    def handlers(self) -> dict[int, Callable]:
        return {
            RequestCode.GET_ROUTEINFO_BY_TOPIC: self.get_route,
            RequestCode.GET_BROKER_CLUSTER_INFO: self.get_cluster_info,
            RequestCode.GET_ALL_TOPIC_LIST_FROM_NAMESERVER: self.get_topic_list,
        }

    def _broker_data(self) -> BrokerData:
        return BrokerData(self.config.cluster_name, self.config.broker_name,
                          {MASTER_ID: self._broker_addr()})

    def route_data(self, topic: str) -> TopicRouteData | None:
        """TopicRouteData for ``topic``; None when it does not exist (nothing is created).

        The template topic has a route only while the broker auto-creates topics: that is
        how a RocketMQ producer learns it may send to a topic that does not exist yet.
        """
        tc = self.topics.get(topic)
        if tc is None or (topic == DEFAULT_TOPIC and not self.config.auto_create_topic):
            return None
        return TopicRouteData(
            queue_datas=[QueueData(self.config.broker_name, tc.read_queue_nums,
                                   tc.write_queue_nums, tc.perm or PERM_READ_WRITE,
                                   tc.topic_sys_flag)],
            broker_datas=[self._broker_data()])

    async def get_route(self, conn, cmd: RemotingCommand) -> RemotingCommand:
        # A bad header (HeaderError) or an unknown topic is a Refusal: the server answers it.
        h = GetRouteInfoRequestHeader.from_ext(cmd.ext_fields)
        data = self.route_data(h.topic)
        if data is None:
            raise Refusal(ResponseCode.TOPIC_NOT_EXIST,
                          f"No topic route info in name server for the topic: {h.topic}")
        standard = wants_standard_json(cmd.version, h.accept_standard_json_only)
        return cmd.response(ResponseCode.SUCCESS, body=data.encode(standard_json=standard))

    async def get_cluster_info(self, conn, cmd: RemotingCommand) -> RemotingCommand:
        # Always standard JSON (quoted broker ids): every client version reads that here.
        name = self.config.broker_name
        info = ClusterInfo({name: self._broker_data()}, {self.config.cluster_name: [name]})
        return cmd.response(ResponseCode.SUCCESS, body=info.encode(standard_json=True))

    async def get_topic_list(self, conn, cmd: RemotingCommand) -> RemotingCommand:
        doc = {"brokerAddr": self._broker_addr(), "topicList": self.topics.names()}
        return cmd.response(ResponseCode.SUCCESS, body=orjson.dumps(doc))
