"""A throwaway ``txbroker serve`` subprocess on free ports with a temp data dir, set up with the
broker settings a trace was generated for (so its expectations hold).

It is a :class:`~txbroker.bench.chaos.process.BrokerProcess` (the one class that runs a broker
subprocess) used as a context manager: started on entry, stopped gracefully on exit.  It
listens on loopback unless told ``host`` (an interface of this machine, or ``0.0.0.0``) and
announces ``advertise`` in its routes, the address executors on other machines dial.  It also
serves the Kafka listener on an ephemeral port (:attr:`EmbeddedBroker.bootstrap`), so the same
broker replays a trace through RocketMQ half messages and through Kafka transactions.  When it
does not start, :class:`EmbeddedBrokerError` carries the end of its log: the log lives in the
temp dir, which is removed on the way out.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Self

from txbroker.bench.chaos.process import BrokerProcess
from txbroker.bench.trace.spec import BrokerSettings


class EmbeddedBrokerError(RuntimeError):
    """The embedded broker did not start: the first line says why, the rest is its log's end."""


def serve_settings(settings: BrokerSettings, host: str = "127.0.0.1",
                   advertise: str = "") -> dict[str, object]:
    """``txbroker serve`` options for a trace's broker: ephemeral ports (the Kafka listener's
    too), no metrics."""
    return {"listen_host": host, "advertised_host": advertise,
            "broker_port": 0, "namesrv_port": 0, "kafka_port": 0, "metrics_port": -1,
            "segment_size": 64 * 1024 * 1024,
            "transaction_timeout": settings.transaction_timeout,
            "transaction_check_interval": settings.transaction_check_interval,
            "transaction_check_max": settings.transaction_check_max,
            "log_level": "WARNING"}


class EmbeddedBroker(BrokerProcess):
    """The broker under ``root`` (``data/`` and ``broker.log``); a temp dir removed on close
    unless ``data_dir`` names one."""

    def __init__(self, settings: BrokerSettings, data_dir: str | None = None,
                 host: str = "127.0.0.1", advertise: str = "") -> None:
        self._tmp = None if data_dir else tempfile.mkdtemp(prefix="txbroker-bench-")
        self.root = Path(data_dir or self._tmp)
        super().__init__(self.root / "data", serve_settings(settings, host, advertise),
                         self.root / "broker.log")

    @property
    def bootstrap(self) -> str:
        """``H:P`` of the Kafka listener: what Kafka clients are given as bootstrap server."""
        return self.kafka_addr

    def __enter__(self) -> Self:
        self.root.mkdir(parents=True, exist_ok=True)
        try:
            self.start()
        except (RuntimeError, TimeoutError) as exc:
            tail = self.log_tail(4000).strip().splitlines()[-20:]
            last = tail[-1] if tail else str(exc).splitlines()[0]
            self.close()
            where = str(self.settings["listen_host"]) + (f" advertised as {self.settings['advertised_host']}"
                                 if self.settings["advertised_host"] else "")
            raise EmbeddedBrokerError("\n".join(
                [f"embedded broker ({where}) did not start: {last}", "broker log, last lines:",
                 *(f"  {line}" for line in tail)])) from None
        except BaseException:
            self.close()
            raise
        return self

    def close(self) -> None:
        try:
            self.stop(15)
        except subprocess.TimeoutExpired:
            pass  # stop() killed it
        finally:
            if self._tmp:
                shutil.rmtree(self._tmp, ignore_errors=True)

    def __exit__(self, *exc: object) -> None:
        self.close()
