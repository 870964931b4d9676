"""The half-message transition table and the metrics object: no sockets, no files."""

from __future__ import annotations

import itertools

import pytest

from txbroker.remoting.codes import ResponseCode
from txbroker.service.metrics import BrokerMetrics
from txbroker.service.transaction.state import (
    ConflictError,
    Decision,
    HalfState,
    Outcome,
    decide,
)

P, C, R, D = HalfState.PENDING, HalfState.COMMITTED, HalfState.ROLLED_BACK, HalfState.DISCARDED

#: The whole table, spelled out: (state, decision, operator) -> (outcome, state after).
EXPECTED = {
    (P, Decision.COMMIT, False): (Outcome.APPLY, C),
    (P, Decision.ROLLBACK, False): (Outcome.APPLY, R),
    (P, Decision.DISCARD, False): (Outcome.APPLY, D),
    (P, Decision.RESUME, False): (Outcome.DUPLICATE, P),
    (C, Decision.COMMIT, False): (Outcome.DUPLICATE, C),
    (C, Decision.ROLLBACK, False): (Outcome.CONFLICT, C),
    (C, Decision.DISCARD, False): (Outcome.CONFLICT, C),
    (C, Decision.RESUME, False): (Outcome.CONFLICT, C),
    (R, Decision.COMMIT, False): (Outcome.CONFLICT, R),
    (R, Decision.ROLLBACK, False): (Outcome.DUPLICATE, R),
    (R, Decision.DISCARD, False): (Outcome.CONFLICT, R),
    (R, Decision.RESUME, False): (Outcome.CONFLICT, R),
    (D, Decision.COMMIT, False): (Outcome.CONFLICT, D),
    (D, Decision.ROLLBACK, False): (Outcome.CONFLICT, D),
    (D, Decision.DISCARD, False): (Outcome.DUPLICATE, D),
    (D, Decision.RESUME, False): (Outcome.APPLY, P),
    # an operator may also resolve what the check service gave up on
    (D, Decision.COMMIT, True): (Outcome.APPLY, C),
    (D, Decision.ROLLBACK, True): (Outcome.APPLY, R),
}


@pytest.mark.parametrize("state,decision,operator", list(EXPECTED))
def test_transition_table(state, decision, operator) -> None:
    assert decide(state, decision, operator=operator) == EXPECTED[(state, decision, operator)]


def test_final_states_stay_final_even_for_operators() -> None:
    for state, decision, operator in itertools.product((C, R), Decision, (False, True)):
        outcome, after = decide(state, decision, operator=operator)
        assert after is state
        assert outcome is not Outcome.APPLY
    assert C.final and R.final and not P.final and not D.final


def test_operator_flag_only_widens_discarded() -> None:
    for state, decision in itertools.product((P, C, R), Decision):
        assert decide(state, decision, operator=True) == decide(state, decision)


def test_conflict_error_is_a_clear_refusal() -> None:
    err = ConflictError(C, Decision.ROLLBACK, "U1")
    assert err.code == ResponseCode.TRANSACTION_FAILED
    assert "rollback" in err.remark and "committed" in err.remark and "U1" in err.remark


def test_metrics_are_per_instance_and_render() -> None:
    a, b = BrokerMetrics(), BrokerMetrics()
    a.halves.inc(3)
    a.commits.labels(source="producer").inc()
    a.check_answers.labels(kind="rollback").inc(2)
    a.decision_latency.observe(0.2)
    a.pending.set(7)
    a.set_broker_gauges(connections=4, store={"puts": 10, "data_dir": "/x", "ok": True},
                        held_pulls=1)
    snap = a.snapshot()
    assert snap["tx_halves_total"] == "3"
    assert snap["tx_commits_total_producer"] == "1"
    assert snap["tx_check_answers_total_rollback"] == "2"
    assert snap["tx_pending"] == "7"
    assert snap["tx_decision_latency_seconds_count"] == "1"
    assert snap["connections"] == "4"
    assert snap["store_puts"] == "10"
    assert "store_data_dir" not in snap and "store_ok" not in snap
    assert b.snapshot()["tx_halves_total"] == "0"  # its own registry
    text = a.render().decode()
    assert "txbroker_tx_halves_total 3.0" in text
    assert 'txbroker_store{stat="puts"} 10.0' in text


def test_resolved_states_one_byte_per_half() -> None:
    from txbroker.service.transaction.index import ResolvedStates

    rs = ResolvedStates()
    assert rs.get(0) is None
    rs.set(100, C)
    rs.set(103, R)
    assert (rs.get(100), rs.get(101), rs.get(103), rs.get(104), rs.get(99)) == (C, None, R, None, None)
    rs.set(98, R)  # an older half (a store that lost its head) still fits
    assert (rs.get(98), rs.get(100), rs.get(103)) == (R, C, R)
    rs.set(100, R)
    assert rs.get(100) is R
    # undecided runs: 99, 101-102 inside, plus everything outside the recorded range
    assert list(rs.undecided_runs(90, 110)) == [(90, 98), (99, 100), (101, 103), (104, 110)]
    assert list(rs.undecided_runs(100, 101)) == []
    assert list(ResolvedStates().undecided_runs(5, 9)) == [(5, 9)]
    assert list(ResolvedStates().undecided_runs(5, 5)) == []
    rs.trim_below(101)  # retention deleted halves 98-100
    assert (rs.get(98), rs.get(100), rs.get(103)) == (None, None, R)
    assert list(rs.undecided_runs(101, 104)) == [(101, 103)]
    rs.trim_below(500)  # everything
    assert rs.get(103) is None and list(rs.undecided_runs(500, 502)) == [(500, 502)]
    rs.set(501, C)
    assert rs.get(501) is C and rs.get(500) is None


def test_op_bodies_of_both_rocketmq_lines_parse() -> None:
    from txbroker.service.transaction.oplog import parse_counts, parse_offsets

    assert parse_offsets(b"17") == [17]            # 4.x: one offset
    assert parse_offsets(b"17,18,21,") == [17, 18, 21]  # 5.x batch
    assert parse_offsets(b"x,-1,,5") == [5]        # junk is skipped, never raises
    assert parse_offsets("²,7".encode()) == [7]
    assert parse_counts(b"3:1,4:15,bad,5:") == [(3, 1), (4, 15)]
