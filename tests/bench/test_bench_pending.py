"""``bench.pending`` at a tiny size: fills, measures and restarts, with figures that can be
true (the benchmark itself is not timed)."""

from __future__ import annotations

from txbroker.bench.pending import run


async def test_pending_bench_prints_every_figure(tmp_path) -> None:
    rows = dict(await run(halves=300, due=40, body_size=64, repeat=1, max_seconds=60.0,
                          data_dir=str(tmp_path / "data")))
    assert rows["pending halves"] == "300"
    per_half = int(rows["bytes per pending half, tracemalloc (Python objects alive)"].split()[0]
                   .replace(",", ""))
    assert per_half > 0
    assert rows["check pass, 40 due and checked (median of 1)"].endswith(" ms")
    assert rows["check pass, none due (median of 1)"].endswith(" ms")
    assert rows["restart: recover() from the clean-close snapshot"].endswith(" s")
    assert rows["restart: recover() without snapshot (full replay, as after a crash)"].endswith(" s")
