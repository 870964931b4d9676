"""Fixtures for the gRPC endpoint: a broker with its gRPC port open, and the unmodified 5.x
Python client run in subprocesses (tests/grpc/py5_client.py).

* ``grpc_broker`` — a started in-process :class:`txbroker.broker.Broker` with ``grpc_port=0``;
  ``grpc_endpoint(broker)`` is the ``host:port`` 5.x clients are given, ``visible(broker,
  topic)`` the messages consumers see.
* ``fuzz_endpoint`` — the same broker on a loop of its own in a thread (``.loop``), for
  synchronous tests (hypothesis).
* ``py5`` — ``await py5("send", endpoint, topic, n, *options)`` runs one client scenario to its
  end (bounded) and returns its JSON events; ``py5.start(...)`` returns the running process
  for a test that kills it.
* ``py5_consumer`` — the same for the consumer scenarios (tests/grpc/py5_consumer.py).
* ``node5`` — the same for the unmodified Node.js 5.x client (tests/grpc/node5_client.js),
  installed once per session by ``node5_modules`` (tests/support/node5.py); tests using it
  skip, with one line saying what is missing, where ``node`` or ``npm`` is not installed.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import threading
from pathlib import Path

import pytest

from tests.support import node5 as node5_install
from txbroker.config import BrokerConfig

DRIVER = Path(__file__).with_name("py5_client.py")
CONSUMER_DRIVER = Path(__file__).with_name("py5_consumer.py")
NODE_DRIVER = Path(__file__).with_name("node5_client.js")
#: A client scenario never runs longer (the driver bounds its own waits at 60 s).
CLIENT_TIMEOUT = 90.0


def grpc_endpoint(broker) -> str:
    return f"{broker.host}:{broker.grpc_port}"


def visible(broker, topic: str) -> list:
    """Every message of ``topic`` an in-process broker shows consumers, queue by queue."""
    tc = broker.topics.get(topic)
    out = []
    for qid in range(tc.read_queue_nums if tc else 0):
        res = broker.store.get(topic, qid, 0, 1000)
        if res.status.name == "FOUND":
            out.extend(res.messages())
    return out


@pytest.fixture
def grpc_config(broker_config: BrokerConfig) -> BrokerConfig:
    return broker_config.replace(grpc_port=0)


@pytest.fixture
async def grpc_broker(grpc_config: BrokerConfig):
    from txbroker.broker import Broker

    b = Broker(grpc_config)
    await b.start()
    try:
        yield b
    finally:
        await b.stop()


class ThreadEndpoint(str):
    """``host:port`` of a broker serving on its own loop in a thread (``.loop``), for tests
    that cannot await: hypothesis drives them synchronously."""

    loop: asyncio.AbstractEventLoop


@pytest.fixture
def fuzz_endpoint(grpc_config: BrokerConfig):
    from txbroker.broker import Broker

    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="grpc-fuzz-broker", daemon=True)
    thread.start()
    broker = Broker(grpc_config)
    asyncio.run_coroutine_threadsafe(broker.start(), loop).result(30)
    endpoint = ThreadEndpoint(grpc_endpoint(broker))
    endpoint.loop = loop
    try:
        yield endpoint
    finally:
        asyncio.run_coroutine_threadsafe(broker.stop(), loop).result(30)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()


class Py5:
    def __init__(self, driver: Path = DRIVER) -> None:
        self.driver = driver
        self.procs: list[asyncio.subprocess.Process] = []

    async def start(self, *args: object) -> asyncio.subprocess.Process:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, str(self.driver), *map(str, args), stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE)
        self.procs.append(proc)
        return proc

    async def events_until(self, proc: asyncio.subprocess.Process, key: str,
                           count: int = 1, timeout: float = CLIENT_TIMEOUT) -> list[dict]:
        """Read ``proc``'s events until ``count`` of them hold ``key``."""
        events: list[dict] = []

        async def read() -> None:
            seen = 0
            while seen < count:
                line = await proc.stdout.readline()
                if not line:
                    err = (await proc.stderr.read()).decode(errors="replace")[-3000:]
                    raise AssertionError(f"client ended early: {events}\n{err}")
                event = json.loads(line)
                events.append(event)
                seen += key in event

        await asyncio.wait_for(read(), timeout)
        return events

    async def __call__(self, *args: object, timeout: float = CLIENT_TIMEOUT) -> list[dict]:
        proc = await self.start(*args)
        try:
            out, err = await asyncio.wait_for(proc.communicate(), timeout)
        except TimeoutError:
            proc.kill()
            raise
        events = [json.loads(line) for line in out.decode().splitlines() if line.startswith("{")]
        assert proc.returncode == 0 and events and events[-1].get("done"), \
            f"exit {proc.returncode}: {events}\n{err.decode(errors='replace')[-3000:]}"
        return events

    def kill_all(self) -> None:
        for proc in self.procs:
            if proc.returncode is None:
                proc.kill()


@pytest.fixture
async def py5():
    runner = Py5()
    yield runner
    runner.kill_all()
    for proc in runner.procs:
        if proc.returncode is None:
            await proc.wait()


@pytest.fixture
async def py5_consumer():
    """As ``py5``, for the consumer scenarios of tests/grpc/py5_consumer.py."""
    runner = Py5(CONSUMER_DRIVER)
    yield runner
    runner.kill_all()
    for proc in runner.procs:
        if proc.returncode is None:
            await proc.wait()


class Node5(Py5):
    """:class:`Py5` running the Node.js client's driver with the installed client on NODE_PATH."""

    def __init__(self, node_modules: Path) -> None:
        super().__init__(NODE_DRIVER)
        self.env = {**os.environ, "NODE_PATH": str(node_modules)}

    async def start(self, *args: object) -> asyncio.subprocess.Process:
        proc = await asyncio.create_subprocess_exec(
            "node", str(self.driver), *map(str, args), stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE, env=self.env)
        self.procs.append(proc)
        return proc


@pytest.fixture(scope="session")
def node5_modules() -> Path:
    """The pinned Node.js client, installed once per session (and cached across sessions)."""
    reason = node5_install.missing()
    if reason is not None:
        pytest.skip(reason)
    return node5_install.install()


@pytest.fixture
async def node5(node5_modules: Path):
    runner = Node5(node5_modules)
    yield runner
    runner.kill_all()
    for proc in runner.procs:
        if proc.returncode is None:
            await proc.wait()
