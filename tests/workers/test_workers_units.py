"""``txbroker serve --workers N`` without starting a worker: the worker state table, each
worker's derived settings, the settings refused before anything binds (one ``error:`` line,
exit 2, through the real CLI), and a worker process that cannot be created."""

from __future__ import annotations

import os

import pytest
from click.testing import CliRunner

from txbroker.cli.main import main
from txbroker.config import BrokerConfig, ConfigError, load_config
from txbroker.store.lock import DataDirLock
from txbroker.workers import (
    BACKOFF_FIRST,
    BACKOFF_MAX,
    PORT_STEP,
    STABLE_AFTER,
    TRANSITIONS,
    Supervisor,
    Worker,
    WorkerStartError,
    WorkerState,
    WorkerStateError,
    next_backoff,
    plan,
    split_worker_name,
    worker_environ,
)


def test_worker_states_move_only_by_the_table() -> None:
    w = Worker(0, BrokerConfig())
    for state in (WorkerState.SERVING, WorkerState.BACKOFF, WorkerState.STARTING,
                  WorkerState.SERVING, WorkerState.STOPPING, WorkerState.STOPPED):
        w.to(state)
    assert TRANSITIONS[WorkerState.STOPPED] == frozenset()
    with pytest.raises(WorkerStateError, match="stopped -> starting"):
        w.to(WorkerState.STARTING)
    # a stopping worker is never restarted
    w = Worker(1, BrokerConfig(), state=WorkerState.STOPPING)
    with pytest.raises(WorkerStateError):
        w.to(WorkerState.BACKOFF)


def test_each_worker_gets_its_name_dir_ports_and_kafka_node(tmp_path) -> None:
    base = BrokerConfig(data_dir=str(tmp_path), workers=3, broker_port=20000, kafka_port=19092,
                        metrics_port=19500, namesrv_port=9876)
    configs = plan(base)
    assert [c.broker_name for c in configs] == ["broker-a-w0", "broker-a-w1", "broker-a-w2"]
    assert [c.data_dir for c in configs] == [str(tmp_path / f"worker-{i}") for i in range(3)]
    assert [c.broker_port for c in configs] == [20000, 20000 + PORT_STEP, 20000 + 2 * PORT_STEP]
    assert [c.kafka_port for c in configs] == [19092, 19092 + PORT_STEP, 19092 + 2 * PORT_STEP]
    assert [c.metrics_port for c in configs] == [19500, 19510, 19520]
    assert [c.kafka_node_id for c in configs] == [0, 1, 2]
    assert all(c.ha_port == -1 and c.workers == 1 and c.namesrv_port == -1 for c in configs)
    # ephemeral stays ephemeral, off stays off
    eph = plan(base.replace(broker_port=0, kafka_port=-1, metrics_port=0))
    assert {(c.broker_port, c.ha_port, c.kafka_port, c.metrics_port) for c in eph} == {(0, 0, -1, 0)}
    assert split_worker_name("broker-a-w12") == ("broker-a", 12)
    assert split_worker_name("broker-a") is None


def test_worker_environment_carries_every_setting_and_reads_back(tmp_path) -> None:
    config = plan(BrokerConfig(data_dir=str(tmp_path), workers=2, broker_port=0,
                               cluster_secret="s3cret-s3cret", flush_interval=0.05))[1]
    env = worker_environ(config, {"PATH": "/bin", "TXBROKER_SEGMENT_SIZE": "1"})
    assert env["PATH"] == "/bin" and env["TXBROKER_CLUSTER_SECRET"] == "s3cret-s3cret"
    assert load_config({}, env) == config  # the parent's TXBROKER_SEGMENT_SIZE did not leak


def test_workers_auto_is_the_cpu_count() -> None:
    assert load_config({}, {"TXBROKER_WORKERS": "auto"}).workers == (os.cpu_count() or 1)
    assert load_config({"workers": "3"}, {}).workers == 3
    with pytest.raises(ConfigError, match="workers=0"):
        load_config({"workers": "0"}, {})


def _serve(*args: str, env: dict[str, str] | None = None):
    return CliRunner().invoke(main, ["serve", *args], env=env, catch_exceptions=False)


@pytest.mark.parametrize("args, says", [
    # worker 1's broker port (20000 + 10) is worker 0's Kafka port
    (["--broker-port", "20000", "--kafka-port", "20010"],
     "worker 0's Kafka port and worker 1's broker port are both 20010"),
    (["--broker-port", "65530"], "worker 1's broker port would be 65540, past 65535"),
    (["--controller-addr", "127.0.0.1:9878"], "workers=2 with controller_addr"),
    (["--namesrv-addr", "127.0.0.1:9876", "--etcd-endpoints", "127.0.0.1:2379"],
     "workers=2 with etcd_endpoints"),
    (["--broker-id", "1"], "workers=2 with broker_id=1"),
    (["--namesrv-port", "-1"], "workers=2 with namesrv_port=-1"),
], ids=["collision", "range", "controller", "etcd", "slave", "no-namesrv"])
def test_refused_settings_are_one_line(tmp_path, args, says) -> None:
    result = _serve("--workers", "2", "--data-dir", str(tmp_path / "d"), *args)
    assert result.exit_code == 2, result.output
    err = result.stderr.strip()
    assert err.startswith("error: ") and "\n" not in err and says in err, err
    assert not (tmp_path / "d").exists()  # refused before touching anything


def test_workers_setting_from_the_environment(tmp_path) -> None:
    result = _serve("--print-config", env={"TXBROKER_WORKERS": "auto"})
    assert result.exit_code == 0, result.output
    assert f"workers = {os.cpu_count() or 1}\n" in result.stdout


async def test_a_worker_process_that_cannot_be_created_is_one_error_line(tmp_path) -> None:
    """The supervisor's own failure (no interpreter to run) names the worker and the program,
    and leaves nothing running: its name server is stopped and the data dir unlocked."""
    config = BrokerConfig(data_dir=str(tmp_path / "d"), workers=2, broker_port=0, namesrv_port=0)
    supervisor = Supervisor(config, python=str(tmp_path / "no-such-python"))
    with pytest.raises(WorkerStartError, match=r"^worker \d: cannot run .*no-such-python: "
                                               r"No such file or directory$"):
        await supervisor.start()
    lock = DataDirLock(tmp_path / "d")
    lock.acquire()  # released by the failed start
    lock.release()


def test_restart_backoff_doubles_up_to_its_cap_and_starts_afresh_after_a_stable_run() -> None:
    waits = [next_backoff(None, 0.0)]
    for _ in range(10):
        waits.append(next_backoff(waits[-1], 1.0))
    assert waits[:4] == [BACKOFF_FIRST, 2 * BACKOFF_FIRST, 4 * BACKOFF_FIRST, 8 * BACKOFF_FIRST]
    assert waits[-1] == BACKOFF_MAX and max(waits) == BACKOFF_MAX
    assert next_backoff(BACKOFF_MAX, STABLE_AFTER) == BACKOFF_FIRST
