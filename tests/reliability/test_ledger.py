"""The chaos ledger's verdicts: each invariant violation is detected, a clean run passes."""

from __future__ import annotations

import pytest

from txbroker.bench.chaos.ledger import Ledger


def clean() -> Ledger:
    led = Ledger()
    for key, kind in (("a", "commit"), ("b", "rollback"), ("c", "unknown-commit"), ("d", "unknown-rollback")):
        led.begin(key, kind)
        led.execute(key)
    assert led.check("c") == "commit"
    assert led.check("d") == "rollback"
    led.delivered("a", 0, 0)
    led.delivered("c", 1, 0)
    return led


def test_clean_run_passes():
    r = clean().verify(pending_at_end=0)
    assert r.ok, r
    assert r.outcomes == {"commit": 1, "rollback": 1, "unknown-commit": 1, "unknown-rollback": 1}
    assert (r.checks_expected, r.checks_duplicate, r.checks_unexpected) == (2, 0, 0)
    assert "RESULT: PASS" in r.table()


def test_execute_reports_what_to_send():
    led = Ledger()
    for key, kind, sent in (("a", "commit", "commit"), ("b", "rollback", "rollback"),
                            ("c", "unknown-commit", "unknown"), ("d", "unknown-rollback", "unknown")):
        led.begin(key, kind)
        assert led.execute(key) == sent


def test_lost_commit_detected():
    led = clean()
    led.begin("e", "commit")
    led.execute("e")
    r = led.verify(0)
    assert r.lost == ["e"] and not r.ok
    assert led.missing_commits() == ["e"]


def test_rolled_back_delivery_detected():
    led = clean()
    led.delivered("b", 2, 0)
    r = led.verify(0)
    assert r.wrongly_delivered == ["b"] and not r.ok


def test_failed_send_is_rolled_back_and_never_delivered():
    led = clean()
    led.begin("f", "commit")
    led.send_failed("f")
    assert led.check("f") == "rollback"
    assert led.verify(0).ok
    led.delivered("f", 3, 9)
    assert led.verify(0).wrongly_delivered == ["f"]


def test_check_while_half_answer_in_flight_is_unknown():
    led = Ledger()
    led.begin("g", "commit")
    assert led.check("g") == "unknown"
    led.delivered("g", 0, 0)
    assert led.verify(0).unknown_delivered == ["g"]


def test_commit_at_two_positions_is_a_duplicate_but_same_position_is_a_redelivery():
    led = clean()
    led.delivered("a", 0, 0)
    r = led.verify(0)
    assert r.ok and r.redelivered == 1
    led.delivered("a", 2, 5)
    r = led.verify(0)
    assert r.duplicated == ["a"] and not r.ok


def test_checks_classified():
    led = clean()
    led.check("c")  # after a final answer: duplicate
    led.check("nobody")  # a key no producer ever used: unexpected
    r = led.verify(0)
    assert (r.checks_expected, r.checks_duplicate, r.checks_unexpected) == (2, 1, 1)
    assert not r.ok


def test_offsets_moving_back_past_persisted_detected():
    led = clean()
    led.offset_sample("T/0", 5, "persisted")
    led.offset_sample("T/0", 7, "live")
    led.offset_sample("T/0", 7, "persisted")
    assert led.verify(0).ok
    led.offset_sample("T/0", 6, "live")
    assert led.verify(0).offsets_moved_back == ["T/0: persisted 7, then live 6"]


def test_pending_at_end_fails():
    assert not clean().verify(pending_at_end=3).ok


def test_bad_input_refused():
    led = Ledger()
    with pytest.raises(ValueError):
        led.begin("x", "maybe")
    led.begin("x", "commit")
    with pytest.raises(ValueError):
        led.begin("x", "commit")
