"""``bench.broker --tls``: rows against a broker that accepts TLS only (a throwaway CA and
certificate made by the bench), and the plaintext-against-TLS comparison, at a tiny size on
real broker processes.  The figures are not timed, only checked for being there and possible."""

from __future__ import annotations

import argparse
import re

import pytest

from txbroker.bench.broker import (
    BrokerProc,
    Result,
    Row,
    main,
    rows_of,
    run_delivery,
    run_row,
    tls_comparison,
)
from txbroker.bench.pki import ThrowawayPki
from txbroker.bench.remoting import echo_ceiling
from txbroker.remoting.client import RemotingClient
from txbroker.remoting.codes import RequestCode
from txbroker.remoting.command import RemotingCommand


def _result(tps: float, broker_us: float, client_us: float) -> Result:
    return Result(sent=10, seen=10, seconds=1.0, tps=tps, p50_ms=1.0, p99_ms=2.0,
                  broker_us=broker_us, client_us=client_us, echo_rate=0.1, echo_cpu=5.0)


def test_tls_is_the_innermost_choice_so_twins_run_side_by_side() -> None:
    args = argparse.Namespace(kind="tx,plain", flush="async", client="sdk", producers="64",
                              connections="shared", workers="1", tls="both")
    assert [(r.kind, r.tls) for r in rows_of(args)] == [
        ("tx", False), ("tx", True), ("plain", False), ("plain", True)]
    assert Row("async", "tx", "sdk", 64, "shared", tls=True).plaintext() == \
        Row("async", "tx", "sdk", 64, "shared")


def test_comparison_gives_ratio_cost_cpu_and_the_verdict() -> None:
    plain = Row("async", "tx", "sdk", 64, "shared")
    tls = Row("async", "tx", "sdk", 64, "shared", tls=True)
    lines = tls_comparison({plain: _result(10_000, 60.0, 30.0), tls: _result(8_000, 70.0, 35.0)})
    # CPU: 90 µs per message in plaintext, 105 over TLS: 1 - 90/105 = 14.3 %
    assert lines[1].split()[6:] == ["10,000", "8,000", "0.800", "20.0%", "60.0", "/", "70.0",
                                    "30.0", "/", "35.0", "14.3%"]
    assert lines[-1] == ("target: TLS costs <= 25% of plaintext msgs/s: met (largest cost 20.0%; "
                         "by CPU 14.3%)")
    lines = tls_comparison({plain: _result(10_000, 60.0, 30.0), tls: _result(7_000, 90.0, 40.0)})
    assert lines[-1].endswith("not met (largest cost 30.0%; by CPU 30.8%)")
    assert tls_comparison({plain: _result(10_000, 60.0, 30.0)}) == []  # nothing to compare


@pytest.mark.slow
@pytest.mark.parametrize("kind, client", [("tx", "raw"), ("delivery", "sdk")])
async def test_rows_run_against_a_broker_that_accepts_tls_only(tmp_path, kind, client) -> None:
    echo = await echo_ceiling(4, 1, 0.2)
    with ThrowawayPki() as pki, BrokerProc("async", str(tmp_path), pki=pki) as broker:
        if kind == "delivery":
            result = await run_delivery(broker, client, 500, 32, echo)
        else:
            result = await run_row(broker, kind, client, 4, False, 0.4, 2000, echo)
        # The clients did speak TLS: a plaintext one is turned away by this broker.
        plain = RemotingClient(broker.addr)
        with pytest.raises(ConnectionError):
            await plain.invoke(RemotingCommand.request(RequestCode.GET_BROKER_CLUSTER_INFO), 5.0)
        await plain.close()
    assert 0 < result.seen == result.sent
    assert result.tps > 0 and result.client_us > 0


@pytest.mark.slow
def test_tls_both_prints_both_rows_and_the_tls_cost(capsys) -> None:
    main(["--kind", "tx", "--client", "sdk", "--producers", "4", "--connections", "shared",
          "--flush", "async", "--tls", "both", "--repeat", "1", "--seconds", "0.4",
          "--max-tx", "1000"])
    out = capsys.readouterr().out.splitlines()
    table = [line.split() for line in out if line.startswith("async ")]
    # the table's two rows (plaintext, TLS), then the comparison's one
    assert [(row[6], int(row[7].replace(",", "")) > 0) for row in table[:2]] == [
        ("off", True), ("on", True)]
    assert any(line.startswith("TLS against plaintext") for line in out)
    cost = table[2]
    assert float(cost[6].replace(",", "")) > 0 and float(cost[7].replace(",", "")) > 0
    assert re.fullmatch(r"-?\d+\.\d%", cost[9])
    assert re.fullmatch(r"-?\d+\.\d%", cost[-1])
    assert re.match(r"target: TLS costs <= 25% of plaintext msgs/s: (met|not met) \(largest cost "
                    r"-?\d+\.\d%; by CPU -?\d+\.\d%\)$", out[-1])
