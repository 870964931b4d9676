"""``bench.broker`` at a tiny size: each client kind's row runs against a real ``txbroker serve``
and prints every figure, with values that can be true (the benchmark itself is not timed)."""

from __future__ import annotations

import pytest

from txbroker.bench.broker import BrokerProc, Row, format_row, run_row
from txbroker.bench.remoting import echo_ceiling

pytestmark = pytest.mark.slow  # two broker processes and an echo process: about 4 s


@pytest.mark.parametrize("client, sharing", [("raw", "each"), ("sdk", "shared")])
async def test_row_prints_sane_figures(tmp_path, client: str, sharing: str) -> None:
    echo = await echo_ceiling(4, 1, 0.2)
    assert echo[0] > 0 and echo[1] > 0
    with BrokerProc("async", str(tmp_path)) as broker:
        result = await run_row(broker, client, 4, sharing == "shared", 0.4, 5000, echo)
    assert 0 < result.seen == result.sent <= 5000
    assert result.tps > 0 and 0 < result.p50_ms <= result.p99_ms
    assert result.broker_us > 0 and result.client_us > 0
    assert result.echo_rate > 0 and result.echo_cpu > 0

    line = format_row(Row("async", client, 4, sharing), result)
    flush, kind, producers, shown_sharing, *figures = line.split()
    assert (flush, kind, producers, shown_sharing) == ("async", client, "4", sharing)
    committed, tps, p50, p99, broker_us, client_us, rate, cpu = (
        float(f.replace(",", "")) for f in figures)
    assert committed == result.seen and tps > 0 and p99 >= p50 > 0
    assert broker_us > 0 and client_us > 0 and rate > 0 and cpu > 0
