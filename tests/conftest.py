"""Shared fixtures: a real broker, in-process or as a subprocess.

Everything here is real: a broker bound to 127.0.0.1 port 0 with a temp data dir, TCP, files,
signals.  Settings are small so tests stay fast (1 MiB segments, check interval 0.2 s,
transaction timeout 0.5 s).

* ``broker_config`` — a :class:`BrokerConfig` for tests; derive variants with
  ``broker_config.replace(flush_mode="sync", ...)``.
* ``broker`` — a started in-process :class:`txbroker.broker.Broker` built from
  ``broker_config``; stopped (gracefully) after the test.  Use ``broker.broker_addr`` /
  ``broker.namesrv_addr`` / ``broker.store`` / ``broker.tx`` / ``broker.registry``.
* ``broker_client`` — a connected :class:`RemotingClient` to ``broker``.
* ``broker_process`` — a factory: ``proc = broker_process(data_dir=None, **overrides)`` starts
  ``txbroker serve`` in a subprocess (overrides are BrokerConfig field names → values), waits
  for its ready line and returns a :class:`BrokerProcess` with ``.broker_addr``,
  ``.namesrv_addr``, ``.data_dir``, ``.kill()`` (SIGKILL), ``.stop()`` (SIGTERM + wait, returns
  the exit code), ``.restart(**overrides)`` (same data dir, new ports) and ``.log_tail()``.
  It is the chaos harness's class (bench/chaos/process.py), given ephemeral ports.
  Every process is killed at teardown.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from txbroker.bench.chaos.process import BrokerProcess
from txbroker.config import BrokerConfig

#: Settings every test broker shares (small and fast); a test overrides what it needs.
TEST_SETTINGS = {
    "listen_host": "127.0.0.1",
    "broker_port": 0,
    "namesrv_port": 0,
    "metrics_port": -1,
    "segment_size": 1024 * 1024,
    "max_message_size": 256 * 1024,
    "consume_queue_entries": 4096,
    "flush_mode": "async",
    "flush_interval": 0.05,
    "offset_persist_interval": 0.2,
    "transaction_check_interval": 0.2,
    "transaction_timeout": 0.5,
    "max_pull_suspend": 5.0,
    "shutdown_grace": 2.0,
}


#: Items that use these fixtures start a Spark JVM.
SPARK_FIXTURES = {"spark", "e2e_run"}


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items) -> None:
    """Spark, C++-client and chaos tests are ``slow`` too, so ``-m "not slow"`` leaves them out.

    Under ``pytest -n 2 --dist loadgroup`` the Spark tests share one worker: their session
    fixtures (a JVM, a bench run) would otherwise start once per worker; and the C++-client
    and chaos tests share one, so no two of their timed failovers run side by side.  First among the
    hooks, so the group mark is there when pytest-xdist reads the groups."""
    for item in items:
        spark = SPARK_FIXTURES & set(getattr(item, "fixturenames", ()))
        if "needs_cpp" in item.keywords or "chaos" in item.keywords or spark:
            item.add_marker(pytest.mark.slow)
        if spark:
            item.add_marker(pytest.mark.xdist_group("spark"))
        elif (("needs_cpp" in item.keywords or "chaos" in item.keywords)
              and item.get_closest_marker("xdist_group") is None):
            # Clusters killed and timed under load: one at a time, never two side by side.
            item.add_marker(pytest.mark.xdist_group("clusters"))


@pytest.fixture
def broker_config(tmp_path: Path) -> BrokerConfig:
    return BrokerConfig(data_dir=str(tmp_path / "data"), **TEST_SETTINGS)


@pytest.fixture
async def broker(broker_config: BrokerConfig):
    from txbroker.broker import Broker

    b = Broker(broker_config)
    await b.start()
    try:
        yield b
    finally:
        await b.stop()


@pytest.fixture
async def broker_client(broker):
    from txbroker.remoting.client import RemotingClient

    client = RemotingClient(broker.broker_addr)
    await client.connect()
    try:
        yield client
    finally:
        await client.close()


@pytest.fixture
def broker_process(tmp_path: Path):
    procs: list[BrokerProcess] = []

    def factory(data_dir: str | os.PathLike[str] | None = None, **overrides: object) -> BrokerProcess:
        n = len(procs)
        d = Path(data_dir) if data_dir is not None else tmp_path / f"proc{n}-data"
        p = BrokerProcess(d, {**TEST_SETTINGS, **overrides}, tmp_path / f"proc{n}.log")
        procs.append(p)
        p.start()
        return p

    yield factory
    for p in procs:
        p.kill()


@pytest.fixture
def etcd_cluster(tmp_path: Path):
    """A real three-member etcd on loopback (:class:`txbroker.cluster.local_etcd.LocalEtcd`),
    started and healthy; every member stopped at the end."""
    from txbroker.cluster.local_etcd import LocalEtcd

    cluster = LocalEtcd(tmp_path / "etcd")
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.stop()
