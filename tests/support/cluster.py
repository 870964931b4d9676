"""Starting a cluster for tests: name servers and brokers, in-process or as subprocesses.

Everything is real and on 127.0.0.1 port 0.  In-process (same event loop as the test):

* ``await start_namesrv(broker_expiry=120.0)`` — a started :class:`NameServerProcess`
  (``.addr``, ``.routes`` = its :class:`RouteInfoManager`, ``await .stop()``).
* ``await start_broker(base_config, data_dir, namesrv_addr, broker_name="broker-a", **changes)``
  — a started :class:`Broker` registered with ``namesrv_addr`` (``"h:p"`` or ``"h1:p1;h2:p2"``);
  ``base_config`` is usually the ``broker_config`` fixture (its small test settings).
* ``async with InProcessCluster(base_config, tmp_path) as c:`` — owns what it starts:
  ``await c.namesrv()``, ``await c.broker(broker_name, **changes)`` (``data_dir=`` reuses a directory; registered with every name
  server started so far unless ``namesrv_addr`` is given), all stopped at exit (brokers first, so they unregister).

Subprocesses (to SIGKILL one):

* ``NamesrvSubprocess(log_path, broker_expiry=...)`` — ``txbroker namesrv --port 0``;
  ``.start()`` waits for the ready line and sets ``.addr``; ``.kill()`` / ``.stop()``.
* Brokers: the ``broker_process`` fixture (tests/conftest.py) with
  ``namesrv_addr=...`` and ``broker_name=...`` overrides; its ``.namesrv_addr`` is then the list.

A raw send for tests that watch each answer: ``send_request(topic, body)`` (SEND_MESSAGE_V2
to queue 0).

Queries against a name server: ``await cluster_info(addr)`` (a :class:`ClusterInfo`),
``await route(addr, topic)`` (a :class:`TopicRouteData`, None for TOPIC_NOT_EXIST) and
``await topic_list(addr)``.
"""

from __future__ import annotations

import os
import re
import selectors
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Self

import orjson

from txbroker.broker import Broker
from txbroker.config import BrokerConfig
from txbroker.namesrv import NameServerProcess
from txbroker.remoting.bodies import ClusterInfo, TopicRouteData
from txbroker.remoting.client import RemotingClient
from txbroker.remoting.codes import RequestCode, ResponseCode
from txbroker.remoting.command import RemotingCommand
from txbroker.remoting.headers import (
    GetRouteInfoRequestHeader,
    SendMessageRequestHeader,
)

READY_RE = re.compile(r"^txbroker namesrv ready addr=(\S+)$")


async def start_namesrv(**kw: object) -> NameServerProcess:
    server = NameServerProcess(listen_host="127.0.0.1", port=0, **kw)
    await server.start()
    return server


async def start_broker(base: BrokerConfig, data_dir: Path, namesrv_addr: str, *,
                       broker_name: str = "broker-a", **changes: object) -> Broker:
    config = base.replace(data_dir=str(data_dir), namesrv_addr=namesrv_addr,
                          broker_name=broker_name, **changes)
    broker = Broker(config)
    await broker.start()
    return broker


class InProcessCluster:
    """Name servers and brokers on the test's loop, stopped together at exit."""

    def __init__(self, base: BrokerConfig, tmp_path: Path) -> None:
        self.base = base
        self.tmp_path = tmp_path
        self.namesrvs: list[NameServerProcess] = []
        self.brokers: list[Broker] = []

    @property
    def namesrv_addr(self) -> str:
        return ";".join(n.addr for n in self.namesrvs)

    async def namesrv(self, **kw: object) -> NameServerProcess:
        server = await start_namesrv(**kw)
        self.namesrvs.append(server)
        return server

    async def broker(self, broker_name: str = "broker-a", **changes: object) -> Broker:
        data_dir = Path(str(changes.pop("data_dir", self.tmp_path / f"{broker_name}-{len(self.brokers)}")))
        namesrv_addr = str(changes.pop("namesrv_addr", self.namesrv_addr))
        broker = await start_broker(self.base, data_dir, namesrv_addr,
                                    broker_name=broker_name, **changes)
        self.brokers.append(broker)
        return broker

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        for broker in self.brokers:
            await broker.stop()
        for server in self.namesrvs:
            await server.stop()


class NamesrvSubprocess:
    """``txbroker namesrv`` in a subprocess on an ephemeral port."""

    def __init__(self, log_path: Path, *, broker_expiry: float = 120.0) -> None:
        self.log_path = log_path
        self.broker_expiry = broker_expiry
        self.proc: subprocess.Popen | None = None
        self.addr = ""

    def start(self, timeout: float = 20.0) -> NamesrvSubprocess:
        argv = [sys.executable, "-P", "-m", "txbroker", "namesrv",
                "--port", "0", "--broker-expiry", str(self.broker_expiry)]
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=log,
                                         env={**os.environ, "PYTHONUNBUFFERED": "1"})
        line = b""
        deadline = time.monotonic() + timeout
        with selectors.DefaultSelector() as sel:
            sel.register(self.proc.stdout, selectors.EVENT_READ)
            while b"\n" not in line:
                left = deadline - time.monotonic()
                if left <= 0 or not sel.select(left):
                    break
                chunk = os.read(self.proc.stdout.fileno(), 4096)
                if not chunk:
                    break
                line += chunk
        m = READY_RE.match(line.split(b"\n", 1)[0].decode(errors="replace").strip())
        if not m:
            self.kill()
            raise RuntimeError(f"name server not ready: {line!r}\n{self.log_path.read_text()}")
        self.addr = m.group(1)
        return self

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def stop(self, timeout: float = 10.0) -> int | None:
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.wait(timeout)
        return self.proc.returncode


async def _call(addr: str, cmd: RemotingCommand) -> RemotingCommand:
    client = RemotingClient(addr, reconnect=False)
    try:
        return await client.invoke(cmd, 5.0)
    finally:
        await client.close()


async def cluster_info(addr: str) -> ClusterInfo:
    resp = await _call(addr, RemotingCommand.request(RequestCode.GET_BROKER_CLUSTER_INFO))
    assert resp.code == ResponseCode.SUCCESS, (resp.code, resp.remark)
    return ClusterInfo.decode(resp.body)


async def route(addr: str, topic: str, *, version: int | None = None) -> TopicRouteData | None:
    cmd = RemotingCommand.request(RequestCode.GET_ROUTEINFO_BY_TOPIC,
                                  GetRouteInfoRequestHeader(topic=topic).to_ext())
    if version is not None:
        cmd.version = version
    resp = await _call(addr, cmd)
    if resp.code == ResponseCode.TOPIC_NOT_EXIST:
        return None
    assert resp.code == ResponseCode.SUCCESS, (resp.code, resp.remark)
    return TopicRouteData.decode(resp.body)


async def topic_list(addr: str) -> list[str]:
    resp = await _call(addr, RemotingCommand.request(RequestCode.GET_ALL_TOPIC_LIST_FROM_NAMESERVER))
    assert resp.code == ResponseCode.SUCCESS, (resp.code, resp.remark)
    return orjson.loads(resp.body)["topicList"]


def send_request(topic: str, body: bytes) -> RemotingCommand:
    """SEND_MESSAGE_V2 of ``body`` to queue 0 of ``topic``, as a producer sends it."""
    return RemotingCommand.request(RequestCode.SEND_MESSAGE_V2, SendMessageRequestHeader(
        producer_group="pg", topic=topic, default_topic="TBW102", default_topic_queue_nums=4,
        queue_id=0, sys_flag=0, born_timestamp=0, flag=0, properties="", reconsume_times=0,
        unit_mode=False, batch=False).to_ext_v2(), body)
