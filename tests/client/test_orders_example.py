"""examples/orders end to end against ``txbroker serve`` in a subprocess, as the README runs it."""

from __future__ import annotations

import json
import os
import selectors
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "examples" / "orders" / "orders.py"
TIMEOUT = 30


def _run(namesrv: str, cwd: Path, *args: str) -> list[dict]:
    proc = subprocess.run([sys.executable, str(SCRIPT), "--namesrv", namesrv, *args],
                          check=False, cwd=cwd, capture_output=True, timeout=TIMEOUT, text=True)
    assert proc.returncode == 0, (args, proc.stdout, proc.stderr)
    return [json.loads(line) for line in proc.stdout.splitlines()]


def _read_until(proc: subprocess.Popen, pred, timeout: float = TIMEOUT) -> list[dict]:
    """Lines from ``proc`` until one satisfies ``pred`` (bounded)."""
    lines: list[dict] = []
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ)
    buf = b""
    deadline = time.monotonic() + timeout
    try:
        while True:
            remaining = deadline - time.monotonic()
            assert remaining > 0, f"no matching line within {timeout}s: {lines}"
            if not sel.select(remaining):
                continue
            chunk = os.read(proc.stdout.fileno(), 4096)
            assert chunk, f"process ended early: {lines} {proc.stderr.read()}"
            buf += chunk
            while b"\n" in buf:
                line, buf = buf.split(b"\n", 1)
                lines.append(json.loads(line))
                if pred(lines[-1]):
                    return lines
    finally:
        sel.close()


@pytest.mark.slow
def test_orders_example(broker_process, tmp_path: Path) -> None:
    broker = broker_process()
    ns = broker.namesrv_addr
    # Run from a directory of its own: the databases go to .example-data/ under it, by default.
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    data = cwd / ".example-data"
    orders_db, shipments_db = data / "orders.db", data / "shipments.db"

    [book] = _run(ns, cwd, "place", "--item", "book", "--quantity", "2", "--order-id", "o-book")
    assert book["state"] == "COMMIT_MESSAGE"
    [lamp] = _run(ns, cwd, "place", "--item", "lamp", "--order-id", "o-lamp", "--fail")
    assert lamp["state"] == "ROLLBACK_MESSAGE"
    [desk] = _run(ns, cwd, "place", "--item", "desk", "--order-id", "o-desk", "--lose-end")
    assert desk["state"] == "UNKNOW"  # committed in SQLite, but the broker was never told

    checker = subprocess.Popen(
        [sys.executable, str(SCRIPT), "--namesrv", ns, "checker", "--seconds", "20"],
        cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        # Another process of the group answers the broker's check-back from the database.
        lines = _read_until(checker, lambda d: d.get("check") == desk["transaction_id"]
                            and d.get("state") == "COMMIT_MESSAGE")
        assert lines[0] == {"checker": "ready"}
        # The checker prints before its answer leaves, so it keeps running while orders apply.
        applied = _run(ns, cwd, "apply", "--max", "2", "--timeout", "15")
    finally:
        checker.kill()
        checker.wait(10)
    assert sorted(a["applied"] for a in applied) == ["o-book", "o-desk"]
    with sqlite3.connect(shipments_db) as db:
        rows = db.execute("SELECT order_id, item, quantity FROM shipments ORDER BY order_id").fetchall()
    assert rows == [("o-book", "book", 2), ("o-desk", "desk", 1)]
    with sqlite3.connect(orders_db) as db:
        assert db.execute("SELECT order_id FROM orders ORDER BY order_id").fetchall() == [("o-book",), ("o-desk",)]
    # nothing else arrives: the rolled-back order never reaches the consumer
    elsewhere = tmp_path / "elsewhere" / "data"
    assert _run(ns, cwd, "--data-dir", str(elsewhere), "apply", "--timeout", "1") == []
    # the databases are in the data dirs, none in the working directory
    assert sorted(p.name for p in cwd.iterdir()) == [".example-data"]
    assert {p.name for p in data.iterdir()} >= {"orders.db", "shipments.db"}
    assert [p.name for p in elsewhere.iterdir()] == ["shipments.db"]
