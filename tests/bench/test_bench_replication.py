"""``bench.replication`` at a tiny size: a catch-up and a lag run print every figure (the
benchmark itself is not timed)."""

from __future__ import annotations

from txbroker.bench.replication import run


async def test_replication_bench_prints_every_figure(tmp_path) -> None:
    rows = dict(await run(mib=2, seconds=0.3, data_dir=str(tmp_path / "data"), max_puts=2000))
    assert rows["catch-up: rate"].endswith(" MB/s")
    assert rows["catch-up: time"].endswith(" s")
    assert " / " in rows["lag: bytes, median / max"]
    assert " / " in rows["lag: ms, median / max"]
    assert "puts of 1 KiB" in rows["lag: put load"]
