"""``txbroker serve --workers N``: N broker processes on one machine behind one name server.

One broker process uses one core (one event loop).  To use every core, the supervisor here
runs N ordinary brokers as subprocesses (``python -P -m txbroker serve``), each a broker group
of its own in one cluster, registered with the name server the supervisor embeds (or with
``namesrv_addr``'s name servers when given).  Nothing new is on the wire: RocketMQ clients see
a cluster of N masters, so routes spread producers and consumers over the workers, a
transaction's END goes to the worker that stored its half (the client sends it to the storing
broker's address) and that worker's check service sends its check-backs.

What worker ``i`` gets (:func:`plan`), docs/workers.md:

* broker name ``<broker_name>-w<i>``, data dir ``<data_dir>/worker-<i>`` (the supervisor holds
  ``<data_dir>/lock``, so a single broker and a set of workers never share a directory);
* every fixed port of the configuration moved by ``i * PORT_STEP`` (broker, HA = broker + 1
  unless set, Kafka, metrics); port 0 stays ephemeral (then a restarted worker comes back on
  the broker and Kafka ports it had), -1 stays off; two listeners on one port are refused
  before anything starts, naming both;
* Kafka node id ``max(kafka_node_id, 0) + i`` (one Kafka node per broker group).

The supervisor starts the name server, then the workers, and prints one ready line once every
worker's ready line came; a worker that fails its first start fails the whole start (its own
``error:`` line is on stderr).  Afterwards a worker that exits without being asked to (a
crash, SIGKILL) is restarted on its data dir after a back-off that doubles per failed try
(:data:`BACKOFF_FIRST` to :data:`BACKOFF_MAX`), and recovers alone while the others serve.
Stop mirrors start: SIGTERM to every worker (each drains within ``shutdown_grace``), SIGKILL to
one still running after :data:`STOP_MARGIN` more, then the name server.  Workers run in their
own session so that a terminal's Ctrl-C reaches the supervisor only (it decides the order),
and on Linux they are sent SIGTERM should the supervisor die without stopping them.
"""

from __future__ import annotations

import asyncio
import ctypes
import enum
import logging
import os
import re
import signal
import sys
import time
from dataclasses import dataclass, fields
from pathlib import Path

from txbroker.config import ENV_PREFIX, BrokerConfig, ConfigError, parse_address_list
from txbroker.namesrv import NameServerProcess
from txbroker.remoting.tls import server_tls
from txbroker.store.lock import DataDirLock

log = logging.getLogger(__name__)

#: Worker ``i`` listens on every fixed port of the configuration plus ``i * PORT_STEP``: 10
#: leaves room for RocketMQ's broker + 1 HA port (and its broker - 2 VIP port) per worker.
PORT_STEP = 10
#: Back-off before restarting a crashed worker, doubled after each try that fails again.
BACKOFF_FIRST = 0.5
BACKOFF_MAX = 30.0
#: A worker that served this long since its last restart starts the back-off afresh.
STABLE_AFTER = 60.0
#: At stop, how long past ``shutdown_grace`` a worker may take before it is SIGKILLed.
STOP_MARGIN = 10.0

READY_RE = re.compile(r"^txbroker ready broker=(\S+) namesrv=(\S+)(?: kafka=(\S+))?$")


class WorkerState(enum.Enum):
    STARTING = "starting"  # process spawned, its ready line not seen yet
    SERVING = "serving"  # ready line seen
    BACKOFF = "backoff"  # exited unasked; restarted after the back-off
    STOPPING = "stopping"  # asked to stop (SIGTERM sent)
    STOPPED = "stopped"  # exited after being asked (terminal)


#: Legal moves of a worker's state; anything else is a bug (:class:`WorkerStateError`).
TRANSITIONS: dict[WorkerState, frozenset[WorkerState]] = {
    WorkerState.STARTING: frozenset({WorkerState.SERVING, WorkerState.BACKOFF,
                                     WorkerState.STOPPING}),
    WorkerState.SERVING: frozenset({WorkerState.BACKOFF, WorkerState.STOPPING}),
    WorkerState.BACKOFF: frozenset({WorkerState.STARTING, WorkerState.STOPPING}),
    WorkerState.STOPPING: frozenset({WorkerState.STOPPED}),
    WorkerState.STOPPED: frozenset(),
}


class WorkerStateError(RuntimeError):
    """A transition the table does not allow: the supervisor's bug, never the worker's."""


class WorkerStartError(Exception):
    """A worker exited before its first ready line (its own error line is then on stderr), or
    its process could not be created (``reason``; ``returncode`` None)."""

    def __init__(self, index: int, returncode: int | None, reason: str = "") -> None:
        super().__init__(f"worker {index}: {reason}" if reason else
                         f"worker {index} exited with {describe_exit(returncode)} before it was ready")
        self.index = index
        self.returncode = returncode


def describe_exit(code: int | None) -> str:
    """``code 1`` or ``signal SIGKILL`` (asyncio reports a signal as its negative number)."""
    if code is None:
        return "no exit code"
    if code < 0:
        try:
            return f"signal {signal.Signals(-code).name}"
        except ValueError:
            return f"signal {-code}"
    return f"code {code}"


def next_backoff(previous: float | None, served: float) -> float:
    """The wait before restarting a worker that exited: :data:`BACKOFF_FIRST` after its first
    exit or after it served :data:`STABLE_AFTER` seconds, else double the ``previous`` wait,
    at most :data:`BACKOFF_MAX` (a worker that cannot stay up is not restarted in a loop)."""
    if previous is None or served >= STABLE_AFTER:
        return BACKOFF_FIRST
    return min(previous * 2, BACKOFF_MAX)


def worker_name(broker_name: str, index: int) -> str:
    return f"{broker_name}-w{index}"


_WORKER_NAME_RE = re.compile(r"^(?P<base>.+)-w(?P<index>\d+)$")


def split_worker_name(name: str) -> tuple[str, int] | None:
    """``broker-a-w1`` -> ``("broker-a", 1)``; None for a name that is not a worker's (how
    ``txbroker status`` and ``txn list`` show a machine's workers as one broker)."""
    m = _WORKER_NAME_RE.match(name)
    return (m.group("base"), int(m.group("index"))) if m else None


def _moved(port: int, index: int) -> int:
    """A fixed port moved for worker ``index``; 0 (ephemeral) and -1 (off) stay."""
    return port + index * PORT_STEP if port > 0 else port


def plan(config: BrokerConfig) -> list[BrokerConfig]:
    """Each worker's configuration (``namesrv_addr`` filled in at start when the name server
    is the embedded one), or ConfigError: a setting that cannot be split over workers, or two
    listeners on one port (named, with the rule)."""
    n = config.workers
    if config.controller_addr or config.etcd_endpoints:
        setting = "controller_addr" if config.controller_addr else "etcd_endpoints"
        raise ConfigError(f"workers={n} with {setting}: masters are elected among replicas of "
                          f"one broker group, and workers are separate groups of one broker; "
                          f"run one broker per process to elect its group's master")
    if config.broker_id != 0:
        raise ConfigError(f"workers={n} with broker_id={config.broker_id}: workers are masters; "
                          f"replicate them with single-broker slaves (--broker-name "
                          f"{worker_name(config.broker_name, 0)} --broker-id 1 ...)")
    if not config.namesrv_addr and config.namesrv_port < 0:
        raise ConfigError(f"workers={n} with namesrv_port=-1: clients find the workers through "
                          f"the name server, so it needs its port (or set namesrv_addr)")
    _check_ports(config)
    data = Path(config.data_dir)
    out = []
    for i in range(n):
        ha_port = config.ha_port
        if ha_port == -1 and config.broker_port == 0:
            ha_port = 0  # broker port + 1 is unknown before the bind: ephemeral, stated
        out.append(config.replace(
            workers=1, broker_name=worker_name(config.broker_name, i),
            data_dir=str(data / f"worker-{i}"), namesrv_port=-1,
            broker_port=_moved(config.broker_port, i), ha_port=_moved(ha_port, i),
            kafka_port=_moved(config.kafka_port, i), metrics_port=_moved(config.metrics_port, i),
            kafka_node_id=max(config.kafka_node_id, 0) + i if config.kafka_port >= 0
            else config.kafka_node_id))
    return out


def _check_ports(config: BrokerConfig) -> None:
    """Every fixed port of every worker (and the name server's) apart and in range."""
    seen: dict[int, str] = {}

    def take(port: int, what: str) -> None:
        if port <= 0:
            return
        if port > 65535:
            raise ConfigError(f"{what} would be {port}, past 65535 (worker i listens on each "
                              f"configured port + {PORT_STEP}*i): use lower ports or fewer workers")
        if port in seen:
            raise ConfigError(f"{seen[port]} and {what} are both {port} (worker i listens on each "
                              f"configured port + {PORT_STEP}*i): move one of the base ports")
        seen[port] = what

    if not config.namesrv_addr:
        take(config.namesrv_port, "the name-server port")
    for i in range(config.workers):
        broker = _moved(config.broker_port, i)
        take(broker, f"worker {i}'s broker port")
        if config.ha_port > 0:
            take(_moved(config.ha_port, i), f"worker {i}'s HA port")
        elif config.ha_port == -1 and broker > 0:
            take(broker + 1, f"worker {i}'s HA port (broker port + 1)")
        take(_moved(config.kafka_port, i), f"worker {i}'s Kafka port")
        take(_moved(config.metrics_port, i), f"worker {i}'s metrics port")


def worker_environ(config: BrokerConfig, base: dict[str, str]) -> dict[str, str]:
    """A worker's environment: ``base`` without its ``TXBROKER_*`` variables, plus one for
    every setting of ``config`` (environment, not arguments: a secret stays out of ``ps``)."""
    env = {k: v for k, v in base.items() if not k.startswith(ENV_PREFIX)}
    for f in fields(BrokerConfig):
        value = getattr(config, f.name)
        if value is None:
            continue
        text = ("true" if value else "false") if isinstance(value, bool) else (
            repr(value) if isinstance(value, float) else str(value))
        env[ENV_PREFIX + f.name.upper()] = text
    return env


_PR_SET_PDEATHSIG = 1


def _die_with_parent_fn():
    """Linux: a preexec function making the kernel send the worker SIGTERM when the
    supervisor dies, however it dies; None elsewhere.  libc is loaded here, before the fork."""
    if not sys.platform.startswith("linux"):
        return None
    libc = ctypes.CDLL(None, use_errno=True)
    parent = os.getpid()

    def preexec() -> None:
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
        if os.getppid() != parent:  # the supervisor died before the line above
            os.kill(os.getpid(), signal.SIGTERM)

    return preexec


@dataclass
class Worker:
    """One worker: its configuration, process and state (moved only by :meth:`to`)."""

    index: int
    config: BrokerConfig
    state: WorkerState = WorkerState.STARTING
    proc: asyncio.subprocess.Process | None = None
    addr: str = ""
    kafka_addr: str = ""
    restarts: int = 0
    ready_at: float = 0.0

    @property
    def name(self) -> str:
        return self.config.broker_name

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def to(self, new: WorkerState) -> None:
        if new not in TRANSITIONS[self.state]:
            raise WorkerStateError(f"worker {self.index}: {self.state.value} -> {new.value}")
        self.state = new


class Supervisor:
    """The name server and the workers of one ``txbroker serve --workers N``."""

    def __init__(self, config: BrokerConfig, *, log_level: str = "INFO",
                 python: str = sys.executable) -> None:
        self.config = config
        self.log_level = log_level
        self.python = python
        self.lock = DataDirLock(Path(config.data_dir))
        # The name server speaks TLS as the workers' ports do (a bad certificate: ConfigError);
        # the workers register with it over TLS when they dial peers with it (tls_peers).
        self.namesrv = (NameServerProcess(listen_host=config.listen_host, port=config.namesrv_port,
                                          cluster_secret=config.cluster_secret,
                                          tls=server_tls(config))
                        if not config.namesrv_addr else None)
        self.workers = [Worker(i, c) for i, c in enumerate(plan(config))]
        self._stopping = asyncio.Event()
        self._watches: list[asyncio.Task] = []
        self._preexec = _die_with_parent_fn()

    @property
    def namesrv_addr(self) -> str:
        if self.namesrv is not None:
            return self.namesrv.addr
        return ";".join(parse_address_list(self.config.namesrv_addr))

    def ready_line(self) -> str:
        first = self.workers[0]
        line = f"txbroker ready broker={first.addr} namesrv={self.namesrv_addr}"
        if first.kafka_addr:
            line += f" kafka={first.kafka_addr}"
        return line + " workers=" + ";".join(w.addr for w in self.workers)

    async def start(self) -> None:
        """Lock the data dir, start the name server, then every worker; each waits for its
        ready line.  On failure whatever started is stopped and the error raised
        (:class:`WorkerStartError`, or the name server's ``ListenError``, or
        ``DataDirInUseError``)."""
        self.lock.acquire()
        try:
            if (Path(self.config.data_dir) / "commitlog").exists():
                log.warning("data dir %s holds a single broker's store (commitlog/); the workers "
                            "use %s/worker-N and do not serve it", self.config.data_dir,
                            self.config.data_dir)
            if self.namesrv is not None:
                await self.namesrv.start()
            addr = self.namesrv_addr
            for w in self.workers:
                w.config = w.config.replace(namesrv_addr=addr)
            results = await asyncio.gather(*(self._start_worker(w) for w in self.workers),
                                           return_exceptions=True)
            failed = [r for r in results if isinstance(r, BaseException)]
            if failed:
                raise failed[0]
        except BaseException:
            await self.stop()
            raise
        for w in self.workers:
            self._watches.append(asyncio.create_task(self._watch(w), name=f"txbroker-worker-{w.index}"))
        log.info("%d workers serving behind name server %s", len(self.workers), self.namesrv_addr)

    async def _spawn(self, w: Worker) -> bool:
        """Start ``w``'s process and wait for its ready line: True once serving, False when
        it exited first."""
        try:
            w.proc = await asyncio.create_subprocess_exec(
                self.python, "-P", "-m", "txbroker", "serve", "--log-level", self.log_level,
                stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
                env=worker_environ(w.config, dict(os.environ)), start_new_session=True,
                preexec_fn=self._preexec)
        except OSError as exc:  # no process at all: nothing of the worker's own on stderr
            w.proc = None
            raise WorkerStartError(w.index, None, f"cannot run {self.python}: "
                                                  f"{exc.strerror or exc}") from None
        if self._stopping.is_set():  # stop() came while this one was being spawned
            w.proc.terminate()
            await w.proc.wait()
            return False
        assert w.proc.stdout is not None
        line = (await w.proc.stdout.readline()).decode(errors="replace").strip()
        m = READY_RE.match(line)
        if m is None:
            await w.proc.wait()
            return False
        w.addr, w.kafka_addr = m.group(1), m.group(3) or ""
        # A restart comes back at the same addresses (clients and offsetMsgIds keep them).
        pinned = {"broker_port": int(w.addr.rsplit(":", 1)[1])}
        if w.kafka_addr:
            pinned["kafka_port"] = int(w.kafka_addr.rsplit(":", 1)[1])
        w.config = w.config.replace(**pinned)
        w.ready_at = time.monotonic()
        return True

    async def _start_worker(self, w: Worker) -> None:
        if not await self._spawn(w):
            assert w.proc is not None
            raise WorkerStartError(w.index, w.proc.returncode)
        w.to(WorkerState.SERVING)
        log.info("worker %d (%s) serving at %s, pid %d, data dir %s", w.index, w.name, w.addr,
                 w.pid, w.config.data_dir)

    @staticmethod
    async def _exit_of(w: Worker) -> str:
        """Wait until ``w``'s process has ended; how it ended, for the log."""
        if w.proc is None or w.proc.stdout is None:
            return "could not be started"
        await w.proc.stdout.read()  # drained to the end: the worker writes only its ready line
        code = await w.proc.wait()
        return f"pid {w.proc.pid} exited with {describe_exit(code)}"

    async def _watch(self, w: Worker) -> None:
        """Restart ``w`` whenever it exits unasked, until the supervisor stops."""
        backoff: float | None = None
        while True:
            ended = await self._exit_of(w)
            if self._stopping.is_set():
                return
            served = time.monotonic() - w.ready_at if w.state is WorkerState.SERVING else 0.0
            backoff = next_backoff(backoff, served)
            w.to(WorkerState.BACKOFF)
            log.warning("worker %d (%s): %s; restarting it in %g s", w.index, w.name, ended, backoff)
            try:
                await asyncio.wait_for(self._stopping.wait(), backoff)
                return  # stopped during the back-off
            except TimeoutError:
                pass
            w.to(WorkerState.STARTING)
            w.restarts += 1
            try:
                ready = await self._spawn(w)
            except WorkerStartError as exc:
                log.error("%s", exc)
                continue
            if ready and not self._stopping.is_set():
                w.to(WorkerState.SERVING)
                log.warning("worker %d (%s) restarted: serving at %s again, pid %d (restart %d)",
                            w.index, w.name, w.addr, w.pid, w.restarts)

    async def stop(self) -> None:
        """Mirror of :meth:`start`: the workers (SIGTERM, then SIGKILL past the grace), then
        the name server, then the data dir's lock."""
        self._stopping.set()
        for w in self.workers:
            if w.state in (WorkerState.STARTING, WorkerState.SERVING, WorkerState.BACKOFF):
                w.to(WorkerState.STOPPING)
            if w.proc is not None and w.proc.returncode is None:
                w.proc.send_signal(signal.SIGTERM)
        grace = self.config.shutdown_grace + STOP_MARGIN
        end = time.monotonic() + grace
        for w in self.workers:
            if w.proc is None:
                continue
            try:
                await asyncio.wait_for(w.proc.wait(), max(0.1, end - time.monotonic()))
            except TimeoutError:
                log.warning("worker %d (%s, pid %d) still running %g s after SIGTERM: SIGKILL",
                            w.index, w.name, w.pid, grace)
                w.proc.kill()
                await w.proc.wait()
        if self._watches:  # each ends once its process has: no restart after a stop
            await asyncio.wait(self._watches, timeout=STOP_MARGIN)
        for task in self._watches:
            task.cancel()
        await asyncio.gather(*self._watches, return_exceptions=True)
        self._watches.clear()
        for w in self.workers:
            if w.state is WorkerState.STOPPING:
                w.to(WorkerState.STOPPED)
        if self.namesrv is not None:
            await self.namesrv.stop()
        self.lock.release()
        started = sum(w.proc is not None for w in self.workers)
        if started:
            log.info("%d workers and the name server stopped", started)
