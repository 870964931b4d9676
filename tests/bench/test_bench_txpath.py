"""``bench.txpath`` at a tiny size: every half is answered and every transaction committed
(run_once checks both and raises otherwise); the CPU figures are positive."""

from __future__ import annotations

from txbroker.bench.txpath import main, run_once


async def test_txpath_commits_every_transaction_and_times_both_halves() -> None:
    half, end = await run_once(tx=60, batch=7)
    assert half > 0 and end > 0


def test_txpath_prints_its_table(capsys) -> None:
    main(["--tx", "40", "--batch", "3", "--repeat", "1", "--profile", "5"])
    out = capsys.readouterr().out
    assert "half send + answer" in out and "END_TRANSACTION commit" in out
    assert "function calls" in out  # the cProfile table
