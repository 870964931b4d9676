"""Constants and helpers shared by the bench tests (a module, not conftest, so imports are
unambiguous in the full suite)."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from txbroker.bench.trace.spec import BrokerSettings

#: Settings the end-to-end trace assumes and its embedded broker runs with: a 2 s immunity
#: leaves a wide margin over the 20 ms local transactions on a noisy machine.
E2E_BROKER = BrokerSettings(transaction_timeout=2.0, transaction_check_interval=0.5,
                            transaction_check_max=2)
E2E_TRANSACTIONS = 2000


def read_rows(path: Path) -> tuple[list[dict], pa.Schema]:
    table = pq.read_table(path)
    return table.to_pylist(), table.schema


def write_rows(path: Path, rows: list[dict], schema: pa.Schema) -> None:
    """Replace a Parquet directory's content with ``rows``."""
    for old in path.glob("*"):
        old.unlink()
    path.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows, schema=schema), path / "part-00000.parquet")
