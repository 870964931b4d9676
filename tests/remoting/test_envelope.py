"""The cluster envelope without I/O: a signed request verifies once, within the window, under
the right key and with every byte where it was signed; an answer verifies for its own request
only; the replay memory stays bounded."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from txbroker.remoting import envelope
from txbroker.remoting.envelope import (
    MAX_CLOCK_SKEW,
    NONCE,
    SIGNATURE,
    TIMESTAMP,
    EnvelopeError,
    ReplayGuard,
    Stamp,
    sign_answer,
    sign_request,
    verify_answer,
    verify_request,
)

SECRET = "cluster-secret-1"
NOW = 1_800_000_000.0
CODE = 904  # BROKER_HEARTBEAT


def _nonce(i: int = 1) -> bytes:
    return i.to_bytes(envelope.NONCE_BYTES, "big")


def _heartbeat(**changes: str) -> dict[str, str]:
    ext = {"clusterName": "DefaultCluster", "brokerAddr": "127.0.0.1:10911",
           "brokerName": "broker-a", "brokerId": "0", "epoch": "11",
           "maxOffset": "1234", "confirmOffset": "0", "heartbeatTimeoutMills": "3000"}
    ext.update(changes)
    return ext


def _signed(ext: dict[str, str] | None = None, *, body: bytes = b"", now: float = NOW,
            nonce: bytes = _nonce()) -> dict[str, str]:
    ext = _heartbeat() if ext is None else ext
    sign_request(SECRET, CODE, ext, body, now=now, nonce=nonce)
    return ext


def test_a_signed_request_verifies_and_says_when_and_which() -> None:
    ext = _signed(body=b"{}")
    stamp = verify_request(SECRET, CODE, ext, b"{}")
    assert stamp == Stamp(NOW, _nonce().hex())
    assert ext[TIMESTAMP] == str(int(NOW * 1000)) and ext[NONCE] == _nonce().hex()
    assert len(ext[SIGNATURE]) == 64


def test_wrong_key_is_refused() -> None:
    ext = _signed()
    with pytest.raises(EnvelopeError, match="signature does not match"):
        verify_request("another-secret", CODE, ext, b"")


def test_unsigned_and_half_signed_requests_are_refused() -> None:
    with pytest.raises(EnvelopeError, match="not signed"):
        verify_request(SECRET, CODE, _heartbeat(), b"")
    ext = _signed()
    del ext[NONCE]
    with pytest.raises(EnvelopeError, match="without a timestamp and nonce"):
        verify_request(SECRET, CODE, ext, b"")


def test_bytes_moved_between_two_fields_are_refused() -> None:
    """What RocketMQ's value-only signature let through: epoch 11 with a 3 s timeout became
    epoch 1 with a 13 s one, the values run together being the same bytes."""
    ext = _signed()
    moved = dict(ext, epoch="1", heartbeatTimeoutMills="13000")
    assert "".join(moved[k] for k in ("epoch", "heartbeatTimeoutMills")) == \
        "".join(ext[k] for k in ("epoch", "heartbeatTimeoutMills"))
    with pytest.raises(EnvelopeError, match="does not match"):
        verify_request(SECRET, CODE, moved, b"")


@pytest.mark.parametrize("change", [
    lambda ext, body: (dict(ext, maxOffset="1235"), body),                        # a value
    lambda ext, body: ({("maxOffsets" if k == "maxOffset" else k): v               # a name
                        for k, v in ext.items()}, body),
    lambda ext, body: (dict(ext, extra="x"), body),                                # a field added
    lambda ext, body: ({k: v for k, v in ext.items() if k != "epoch"}, body),      # one removed
    lambda ext, body: (dict(ext, brokerId="0" + ext["confirmOffset"], confirmOffset=""), body),
    lambda ext, body: (ext, body + b"x"),                                          # the body
    lambda ext, body: (dict(ext, brokerName=ext["brokerName"] + "{}"), b""),      # body into a field
    lambda ext, body: (dict(ext, **{TIMESTAMP: str(int(NOW * 1000) + 1)}), body),  # the time
    lambda ext, body: (dict(ext, **{NONCE: _nonce(2).hex()}), body),               # the nonce
])
def test_any_change_after_signing_is_refused(change) -> None:
    ext = _signed(body=b"{}")
    ext2, body2 = change(dict(ext), b"{}")
    with pytest.raises(EnvelopeError, match="does not match"):
        verify_request(SECRET, CODE, ext2, body2)


def test_the_request_code_is_signed() -> None:
    ext = _signed()
    with pytest.raises(EnvelopeError, match="does not match"):
        verify_request(SECRET, 1003, ext, b"")


def test_stale_and_future_timestamps_are_refused() -> None:
    guard = ReplayGuard()
    stamp = verify_request(SECRET, CODE, _signed(), b"")
    with pytest.raises(EnvelopeError, match="outside the accepted window"):
        guard.admit(stamp, NOW + MAX_CLOCK_SKEW + 0.001)
    with pytest.raises(EnvelopeError, match="outside the accepted window"):
        guard.admit(stamp, NOW - MAX_CLOCK_SKEW - 0.001)
    guard.admit(stamp, NOW + MAX_CLOCK_SKEW)  # the edge of the window still counts
    assert len(guard) == 1


def test_a_repeated_nonce_is_refused_within_the_window_and_stale_after_it() -> None:
    guard = ReplayGuard()
    stamp = verify_request(SECRET, CODE, _signed(), b"")
    guard.admit(stamp, NOW)
    for later in (NOW, NOW + 1, NOW + MAX_CLOCK_SKEW):
        with pytest.raises(EnvelopeError, match="repeats a nonce"):
            guard.admit(stamp, later)
    # Past the window the nonce is forgotten, and the timestamp alone refuses the replay.
    with pytest.raises(EnvelopeError, match="outside the accepted window"):
        guard.admit(stamp, NOW + MAX_CLOCK_SKEW + 0.5)
    guard.admit(Stamp(NOW + MAX_CLOCK_SKEW + 0.5, _nonce(3).hex()), NOW + MAX_CLOCK_SKEW + 0.5)
    assert len(guard) == 1  # the first nonce was forgotten


def test_the_replay_memory_is_bounded_and_refuses_rather_than_forgets() -> None:
    guard = ReplayGuard(capacity=3)
    for i in range(3):
        guard.admit(Stamp(NOW, _nonce(i).hex()), NOW)
    with pytest.raises(EnvelopeError, match="too many signed requests"):
        guard.admit(Stamp(NOW, _nonce(9).hex()), NOW)
    with pytest.raises(EnvelopeError, match="repeats a nonce"):  # nothing live was forgotten
        guard.admit(Stamp(NOW, _nonce(0).hex()), NOW)
    # Once they leave the window there is room again.
    later = NOW + MAX_CLOCK_SKEW + 1
    guard.admit(Stamp(later, _nonce(9).hex()), later)
    assert len(guard) == 1


def test_many_requests_over_time_keep_memory_to_one_window() -> None:
    guard = ReplayGuard()
    for i in range(10_000):  # 100 a second for 100 s
        now = NOW + i / 100
        guard.admit(Stamp(now, _nonce(i).hex()), now)
    assert len(guard) <= 100 * MAX_CLOCK_SKEW + 1


def test_an_answer_verifies_for_its_own_request_only() -> None:
    first = _signed(nonce=_nonce(1))[NONCE]
    second = _signed(nonce=_nonce(2))[NONCE]
    answer = {"masterBrokerId": "0", "masterEpoch": "1", "syncStateSetEpoch": "1"}
    body = b'{"syncStateSet":[0],"syncStateSetEpoch":1}'
    sign_answer(SECRET, 0, None, answer, body, first)
    verify_answer(SECRET, 0, None, answer, body, first)
    verify_answer(SECRET, 0, "", answer, body, first)  # no remark and an empty one are alike
    with pytest.raises(EnvelopeError, match="another request"):
        verify_answer(SECRET, 0, None, answer, body, second)  # a recorded answer, replayed
    with pytest.raises(EnvelopeError, match="does not match"):
        verify_answer("another-secret", 0, None, answer, body, first)
    with pytest.raises(EnvelopeError, match="does not match"):
        verify_answer(SECRET, 2000, None, answer, body, first)  # the code is signed
    with pytest.raises(EnvelopeError, match="does not match"):
        verify_answer(SECRET, 0, "fenced", answer, body, first)  # the remark too
    with pytest.raises(EnvelopeError, match="not signed"):
        verify_answer(SECRET, 0, None, {}, body, first)


def test_a_request_signature_is_no_answer_signature() -> None:
    """The kind is signed: a request cannot be passed off as an answer, nor the reverse."""
    ext = _signed()
    with pytest.raises(EnvelopeError):
        verify_answer(SECRET, CODE, None, ext, b"", ext[NONCE])


def test_malformed_stamps_from_a_holder_of_the_secret_are_refused() -> None:
    for field, value in ((TIMESTAMP, "-5"), (TIMESTAMP, "1e9"), (NONCE, "zz" * 16), (NONCE, "ab")):
        ext = _signed()
        ext[field] = value
        # re-signed with the secret, so only the format check can catch it
        ext[SIGNATURE] = envelope._mac(SECRET, envelope.content(
            b"request", {"code": str(CODE)}, ext, b""))
        with pytest.raises(EnvelopeError, match="malformed"):
            verify_request(SECRET, CODE, ext, b"")


def test_a_nonce_of_the_wrong_size_is_a_bug() -> None:
    with pytest.raises(ValueError):
        sign_request(SECRET, CODE, {}, b"", now=NOW, nonce=b"short")


@given(st.dictionaries(st.text(max_size=20), st.text(max_size=40), max_size=12),
       st.binary(max_size=64))
def test_any_peer_input_is_a_stamp_or_an_envelope_error(ext: dict[str, str], body: bytes) -> None:
    """Arbitrary ext fields (signed-looking or not) never raise anything else."""
    for fields in (ext, dict(ext, **{SIGNATURE: "00" * 32, TIMESTAMP: "1", NONCE: "0" * 32})):
        try:
            verify_request(SECRET, CODE, fields, body)
        except EnvelopeError:
            pass
        try:
            verify_answer(SECRET, 0, None, fields, body, "")
        except EnvelopeError:
            pass
