"""A throwaway ``txbroker serve`` subprocess on free loopback ports with a temp data dir, set up
with the broker settings a trace was generated for (so its expectations hold).

It is a :class:`~txbroker.bench.chaos.process.BrokerProcess` (the one class that runs a broker
subprocess) used as a context manager: started on entry, stopped gracefully on exit.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Self

from txbroker.bench.chaos.process import BrokerProcess
from txbroker.bench.trace.spec import BrokerSettings


def serve_settings(settings: BrokerSettings) -> dict[str, object]:
    """``txbroker serve`` options for a trace's broker: ephemeral loopback ports, no metrics."""
    return {"listen_host": "127.0.0.1", "broker_port": 0, "namesrv_port": 0, "metrics_port": -1,
            "segment_size": 64 * 1024 * 1024,
            "transaction_timeout": settings.transaction_timeout,
            "transaction_check_interval": settings.transaction_check_interval,
            "transaction_check_max": settings.transaction_check_max,
            "log_level": "WARNING"}


class EmbeddedBroker(BrokerProcess):
    """The broker under ``root`` (``data/`` and ``broker.log``); a temp dir removed on close
    unless ``data_dir`` names one."""

    def __init__(self, settings: BrokerSettings, data_dir: str | None = None) -> None:
        self._tmp = None if data_dir else tempfile.mkdtemp(prefix="txbroker-bench-")
        self.root = Path(data_dir or self._tmp)
        super().__init__(self.root / "data", serve_settings(settings), self.root / "broker.log")

    def __enter__(self) -> Self:
        self.root.mkdir(parents=True, exist_ok=True)
        try:
            self.start()
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
