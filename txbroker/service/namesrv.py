"""The embedded name server: routes for topics, cluster info, the topic list.

A RocketMQ client needs *some* address answering GET_ROUTEINFO_BY_TOPIC; the route may point
the broker at that same address (client-capture.md §4, ``route_same_port``).  txbroker is a
single broker, so the name server is a view over its own topic table rather than a registry of
brokers: one port is a complete installation.  The handlers are registered on the name-server
port and on the broker port alike.

Route bodies come in two dialects.  Old clients get fastjson's default output, whose
``brokerAddrs`` map has *unquoted* numeric keys (``{0:"127.0.0.1:10911"}``); clients at
version >= V4_9_4 (401), or that send ``acceptStandardJsonOnly=true``, get standard JSON
(protocol.md §4.9).  Both dialects sort keys, as fastjson does.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable

import orjson

from txbroker.config import BrokerConfig
from txbroker.remoting.codec import RemotingCommand
from txbroker.remoting.codes import (
    VERSION_STANDARD_JSON_ROUTE,
    RequestCode,
    ResponseCode,
)
from txbroker.service.topics import (
    PERM_READ_WRITE,
    TopicError,
    TopicManager,
    TopicStoreError,
    is_system_topic,
)

log = logging.getLogger(__name__)

#: Master broker id in ``brokerAddrs`` (MixAll.MASTER_ID).
MASTER_ID = 0

_NUMERIC_KEY = re.compile(rb'(?<=[{,])"(-?\d+)":')


def is_true(value: str | None) -> bool:
    """Java reads only "true"; C++ clients send "1" (protocol.md §2.5), so accept both."""
    return value is not None and value.strip().lower() in ("true", "1")


def fastjson_dumps(doc: object) -> bytes:
    """fastjson's default dialect: sorted keys, numeric map keys left unquoted."""
    return _NUMERIC_KEY.sub(rb"\1:", orjson.dumps(doc, option=orjson.OPT_SORT_KEYS | orjson.OPT_NON_STR_KEYS))


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

    def _broker_data(self) -> dict:
        return {"brokerAddrs": {MASTER_ID: self._broker_addr()},
                "brokerName": self.config.broker_name, "cluster": self.config.cluster_name}

    def route_data(self, topic: str) -> dict | None:
        """TopicRouteData for ``topic``, auto-creating it when the broker allows that."""
        tc = self.topics.get(topic)
        if tc is None:
            if is_system_topic(topic):
                return None
            try:
                tc = self.topics.get_or_create(topic)
            except TopicStoreError:
                raise  # answered with its own code: the disk refused, the topic may be fine
            except TopicError:
                return None
        return {
            "brokerDatas": [self._broker_data()],
            "filterServerTable": {},
            "queueDatas": [{
                "brokerName": self.config.broker_name, "perm": tc.perm or PERM_READ_WRITE,
                "readQueueNums": tc.read_queue_nums, "topicSysFlag": tc.topic_sys_flag,
                "writeQueueNums": tc.write_queue_nums,
            }],
        }

    async def get_route(self, conn, cmd: RemotingCommand) -> RemotingCommand:
        topic = cmd.ext_fields.get("topic")
        if not topic:
            return cmd.response(ResponseCode.SYSTEM_ERROR, "missing header field 'topic'")
        data = self.route_data(topic)
        if data is None:
            return cmd.response(ResponseCode.TOPIC_NOT_EXIST,
                                f"No topic route info in name server for the topic: {topic}")
        standard = (cmd.version >= VERSION_STANDARD_JSON_ROUTE
                    or is_true(cmd.ext_fields.get("acceptStandardJsonOnly")))
        if standard:
            data["brokerDatas"][0]["brokerAddrs"] = {str(MASTER_ID): self._broker_addr()}
            body = orjson.dumps(data, option=orjson.OPT_SORT_KEYS)
        else:
            body = fastjson_dumps(data)
        return cmd.response(ResponseCode.SUCCESS, body=body)

    async def get_cluster_info(self, conn, cmd: RemotingCommand) -> RemotingCommand:
        name = self.config.broker_name
        bd = self._broker_data()
        bd["brokerAddrs"] = {str(MASTER_ID): self._broker_addr()}
        doc = {"brokerAddrTable": {name: bd},
               "clusterAddrTable": {self.config.cluster_name: [name]}}
        return cmd.response(ResponseCode.SUCCESS,
                            body=orjson.dumps(doc, option=orjson.OPT_SORT_KEYS | orjson.OPT_NON_STR_KEYS))

    async def get_topic_list(self, conn, cmd: RemotingCommand) -> RemotingCommand:
        doc = {"brokerAddr": self._broker_addr(), "topicList": self.topics.names()}
        return cmd.response(ResponseCode.SUCCESS, body=orjson.dumps(doc))
