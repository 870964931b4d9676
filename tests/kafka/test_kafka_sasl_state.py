"""The Kafka SASL state machine with no socket: SCRAM against RFC 7677's worked example and an
independent client written here from RFC 5802, PLAIN, the transition table, the back-off, and
a fuzz of the tokens (a reply or a SaslFailure, never another exception)."""

from __future__ import annotations

import base64

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support.kafka_sasl import scram_client

from txbroker.remoting.kafka.apis import ApiKey
from txbroker.remoting.kafka.errors import ErrorCode
from txbroker.service.auth_throttle import AuthThrottle
from txbroker.service.kafka.sasl import (
    TRANSITIONS,
    IllegalSaslTransition,
    SaslFailure,
    SaslSession,
    SaslState,
    ScramServer,
)
from txbroker.service.scram import ScramCredentials, make_credentials
from txbroker.service.users import Users as UserSnapshot

SECRET = b"s" * 32


def users_with(**passwords: str) -> UserSnapshot:
    """The user store's snapshot with these passwords (the real SCRAM derivation)."""
    out = UserSnapshot()
    for user, password in passwords.items():
        out = out.with_password(user, password)
    return out


def test_scram_sha256_matches_the_rfc7677_example() -> None:
    # RFC 7677 section 3: user "user", password "pencil"
    cred = make_credentials("SCRAM-SHA-256", "pencil", base64.b64decode("W22ZaJ0SNY7soEsUEjb6gQ=="),
                            4096)

    class One:
        def scram_credentials(self, user: str, mechanism: str) -> ScramCredentials | None:
            return cred if user == "user" else None

        def check_password(self, user: str, password: str) -> bool:
            return False

    server = ScramServer(One(), "SCRAM-SHA-256", SECRET, nonce=lambda: "%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0")
    first, done = server.step(b"n,,n=user,r=rOprNGfwEbeRWgbNEkqO")
    assert not done
    assert first == (b"r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,"
                     b"s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096")
    final, done = server.step(b"c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,"
                              b"p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ=")
    assert (final, done) == (b"v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4=", True)


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-256", "SCRAM-SHA-512"])
def test_scram_session_authenticates_and_refuses_a_wrong_password(mechanism: str) -> None:
    users = users_with(alice="right")
    for password, ok in (("right", True), ("wrong", False)):
        s = SaslSession((mechanism,), users, SECRET, plain_allowed=False)
        assert s.handshake(1, {"mechanism": mechanism})["error_code"] == ErrorCode.NONE
        assert s.state is SaslState.TOKENS and not s.allows(ApiKey.METADATA)
        bare = "n=alice,r=clientnonce123"
        first = s.authenticate(1, {"auth_bytes": ("n,," + bare).encode()})
        assert first["error_code"] == ErrorCode.NONE and first["session_lifetime_ms"] == 0
        final, expected = scram_client(mechanism, "alice", password, first["auth_bytes"], bare)
        answer = s.authenticate(1, {"auth_bytes": final})
        if ok:
            assert answer["error_code"] == ErrorCode.NONE
            assert answer["auth_bytes"] == expected
            assert s.authenticated and s.allows(ApiKey.METADATA) and s.user == "alice"
        else:
            assert answer["error_code"] == ErrorCode.SASL_AUTHENTICATION_FAILED
            assert mechanism in answer["error_message"] and "wrong" not in answer["error_message"]
            assert s.state is SaslState.FAILED and not s.allows(ApiKey.API_VERSIONS)


def test_scram_unknown_user_looks_like_a_wrong_password() -> None:
    s = SaslSession(("SCRAM-SHA-256",), users_with(alice="right"), SECRET, plain_allowed=False)
    s.handshake(1, {"mechanism": "SCRAM-SHA-256"})
    first = s.authenticate(1, {"auth_bytes": b"n,,n=mallory,r=abc"})
    assert first["error_code"] == ErrorCode.NONE and b",s=" in first["auth_bytes"]
    final, _ = scram_client("SCRAM-SHA-256", "mallory", "x", first["auth_bytes"], "n=mallory,r=abc")
    answer = s.authenticate(1, {"auth_bytes": final})
    assert answer["error_code"] == ErrorCode.SASL_AUTHENTICATION_FAILED
    # the made-up salt is stable per user name: asking twice does not tell who exists
    s2 = SaslSession(("SCRAM-SHA-256",), users_with(alice="right"), SECRET, plain_allowed=False)
    s2.handshake(1, {"mechanism": "SCRAM-SHA-256"})
    again = s2.authenticate(1, {"auth_bytes": b"n,,n=mallory,r=abc"})["auth_bytes"]
    assert again.split(b",")[1] == first["auth_bytes"].split(b",")[1]


@pytest.mark.parametrize("token", [
    b"y,,n=alice,r=abc",            # channel binding flag other than n
    b"p=tls-unique,,n=alice,r=abc",  # channel binding asked for
    b"n,,r=abc,n=alice",            # attributes out of order
    b"n,,n=alice",                  # no nonce
    b"n,,n=al=ice,r=abc",           # '=' not escaped
    b"n,a=bob,n=alice,r=abc",       # authzid not the user
    b"n,,n=alice,r=a\x01b",         # nonce not printable
    b"\xff\xfe",                    # not UTF-8
    b"",
])
def test_scram_malformed_client_first_is_refused(token: bytes) -> None:
    s = SaslSession(("SCRAM-SHA-512",), users_with(alice="right"), SECRET, plain_allowed=False)
    s.handshake(1, {"mechanism": "SCRAM-SHA-512"})
    answer = s.authenticate(2, {"auth_bytes": token})
    assert answer["error_code"] == ErrorCode.SASL_AUTHENTICATION_FAILED
    assert s.state is SaslState.FAILED


def test_scram_client_final_must_carry_the_same_nonce_and_binding() -> None:
    users = users_with(alice="right")
    for tamper in (lambda f: f.replace(b"c=biws", b"c=eSws"),
                   lambda f: f.replace(b"r=cn", b"r=xx"),
                   lambda f: f[: f.index(b",p=")] + b",p=AAAA"):
        s = SaslSession(("SCRAM-SHA-256",), users, SECRET, plain_allowed=False)
        s.handshake(1, {"mechanism": "SCRAM-SHA-256"})
        first = s.authenticate(1, {"auth_bytes": b"n,,n=alice,r=cn"})["auth_bytes"]
        final, _ = scram_client("SCRAM-SHA-256", "alice", "right", first, "n=alice,r=cn")
        answer = s.authenticate(1, {"auth_bytes": tamper(final)})
        assert answer["error_code"] == ErrorCode.SASL_AUTHENTICATION_FAILED, tamper(final)


def _librdkafka_final(first: bytes, client_nonce: str) -> str:
    """The ``r=`` librdkafka before 2.6.1 sends: its nonce, then the server-first nonce
    (which starts with its nonce already)."""
    server_nonce = dict(p.split("=", 1) for p in first.decode().split(","))["r"]
    return client_nonce + server_nonce


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-256", "SCRAM-SHA-512"])
def test_scram_accepts_librdkafkas_doubled_client_nonce(mechanism: str) -> None:
    s = SaslSession((mechanism,), users_with(alice="right"), SECRET, plain_allowed=False)
    s.handshake(1, {"mechanism": mechanism})
    first = s.authenticate(1, {"auth_bytes": b"n,,n=alice,r=rdknonce"})["auth_bytes"]
    doubled = _librdkafka_final(first, "rdknonce")
    assert doubled.startswith("rdknoncerdknonce")
    final, expected = scram_client(mechanism, "alice", "right", first, "n=alice,r=rdknonce",
                                   nonce=doubled)
    answer = s.authenticate(1, {"auth_bytes": final})
    assert answer["error_code"] == ErrorCode.NONE, answer
    assert answer["auth_bytes"] == expected and s.authenticated and s.user == "alice"


@pytest.mark.parametrize("what, nonce, password", [
    # the server's part missing: only the client's nonce, twice
    ("no server nonce", lambda first, full: "rdknonce" + "rdknonce", "right"),
    # the server's part cut short by one character
    ("server nonce cut", lambda first, full: "rdknonce" + full[:-1], "right"),
    # the server's part changed in its last character
    ("server nonce changed", lambda first, full: "rdknonce" + full[:-1] + "!", "right"),
    # something appended after the server nonce
    ("after the server nonce", lambda first, full: "rdknonce" + full + "x", "right"),
    # the doubled form, with a proof from a wrong password
    ("wrong proof", lambda first, full: "rdknonce" + full, "wrong"),
])
def test_scram_doubled_nonce_still_needs_the_server_nonce_and_the_proof(what, nonce,
                                                                       password) -> None:
    s = SaslSession(("SCRAM-SHA-512",), users_with(alice="right"), SECRET, plain_allowed=False)
    s.handshake(1, {"mechanism": "SCRAM-SHA-512"})
    first = s.authenticate(1, {"auth_bytes": b"n,,n=alice,r=rdknonce"})["auth_bytes"]
    full = dict(p.split("=", 1) for p in first.decode().split(","))["r"]
    final, _ = scram_client("SCRAM-SHA-512", "alice", password, first, "n=alice,r=rdknonce",
                            nonce=nonce(first, full))
    answer = s.authenticate(1, {"auth_bytes": final})
    assert answer["error_code"] == ErrorCode.SASL_AUTHENTICATION_FAILED, what
    assert s.state is SaslState.FAILED and not s.authenticated


def test_plain_needs_the_flag_and_the_right_password() -> None:
    users = users_with(alice="right")
    s = SaslSession(("PLAIN", "SCRAM-SHA-256"), users, SECRET, plain_allowed=False)
    answer = s.handshake(1, {"mechanism": "PLAIN"})
    assert answer == {"error_code": ErrorCode.UNSUPPORTED_SASL_MECHANISM,
                      "mechanisms": ["SCRAM-SHA-256"]}
    assert "in the clear" in str(s.failure) and s.state is SaslState.FAILED
    for token, ok in ((b"\0alice\0right", True), (b"alice\0alice\0right", True),
                      (b"\0alice\0wrong", False), (b"bob\0alice\0right", False),
                      (b"\0alice", False), (b"\0\0", False)):
        s = SaslSession(("PLAIN",), users, SECRET, plain_allowed=True)
        s.handshake(0, {"mechanism": "PLAIN"})
        assert s.state is SaslState.RAW_TOKENS
        if ok:
            assert s.token(token) == b"" and s.authenticated
        else:
            with pytest.raises(SaslFailure) as info:
                s.token(token)
            assert b"right" not in str(info.value).encode()
            assert s.state is SaslState.FAILED


def test_unknown_mechanism_and_requests_out_of_turn() -> None:
    s = SaslSession(("SCRAM-SHA-256",), users_with(), SECRET, plain_allowed=False)
    assert s.allows(ApiKey.API_VERSIONS) and s.allows(ApiKey.SASL_HANDSHAKE)
    assert not s.allows(ApiKey.SASL_AUTHENTICATE) and not s.allows(ApiKey.PRODUCE)
    answer = s.handshake(1, {"mechanism": "GSSAPI"})
    assert answer == {"error_code": ErrorCode.UNSUPPORTED_SASL_MECHANISM,
                      "mechanisms": ["SCRAM-SHA-256"]}
    assert s.state is SaslState.FAILED


def test_transition_table_final_states_and_illegal_moves() -> None:
    assert TRANSITIONS[SaslState.COMPLETE] == frozenset()
    assert TRANSITIONS[SaslState.FAILED] == frozenset()
    assert SaslState.COMPLETE not in TRANSITIONS[SaslState.HANDSHAKE]
    s = SaslSession(("SCRAM-SHA-256",), users_with(), SECRET, plain_allowed=False)
    s.handshake(1, {"mechanism": "nope"})
    with pytest.raises(IllegalSaslTransition):
        s.handshake(1, {"mechanism": "SCRAM-SHA-256"})


def test_oversized_token_is_refused_before_parsing() -> None:
    s = SaslSession(("SCRAM-SHA-256",), users_with(alice="x"), SECRET, plain_allowed=False)
    s.handshake(1, {"mechanism": "SCRAM-SHA-256"})
    answer = s.authenticate(1, {"auth_bytes": b"n,,n=alice,r=" + b"a" * 5000})
    assert answer["error_code"] == ErrorCode.SASL_AUTHENTICATION_FAILED
    assert "maximum" in answer["error_message"]


def test_throttle_doubles_per_address_and_logs_once_a_minute() -> None:
    now = [1000.0]
    t = AuthThrottle(lambda: now[0], base=0.1, ceiling=1.0, window=60.0, max_addresses=2)
    assert t.delay("10.0.0.1") == 0.0
    assert t.failed("10.0.0.1") is True
    assert [t.failed("10.0.0.1") for _ in range(3)] == [False, False, False]
    assert t.delay("10.0.0.1") == pytest.approx(0.8)
    t.failed("10.0.0.1")
    assert t.delay("10.0.0.1") == 1.0  # the ceiling
    assert t.delay("10.0.0.2") == 0.0  # per address
    now[0] += 61
    assert t.delay("10.0.0.1") == 0.0 and t.failed("10.0.0.1") is True  # a new minute
    t.succeeded("10.0.0.1")
    assert t.delay("10.0.0.1") == 0.0
    for a in ("a", "b", "c"):
        t.failed(a)
    assert t.delay("a") == 0.0 and t.delay("c") > 0  # bounded: the oldest forgotten


@settings(max_examples=300, deadline=None)
@given(mechanism=st.sampled_from(["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"]),
       tokens=st.lists(st.binary(max_size=300) | st.sampled_from(
           [b"n,,n=alice,r=abc", b"c=biws,r=abc,p=AAAA", b"\0alice\0right", b"n,,n=,r=",
            b"c=,r=,p=", b"n,a=,n=a,r=b,x=y"]), min_size=1, max_size=3))
def test_fuzz_tokens_give_replies_or_refusals(mechanism: str, tokens: list[bytes]) -> None:
    s = SaslSession((mechanism,), users_with(alice="right"), SECRET, plain_allowed=True)
    s.handshake(1, {"mechanism": mechanism})
    for token in tokens:
        if s.state is not SaslState.TOKENS:
            break
        answer = s.authenticate(1, {"auth_bytes": token})
        assert answer["error_code"] in (ErrorCode.NONE, ErrorCode.SASL_AUTHENTICATION_FAILED)
        assert (answer["error_code"] == ErrorCode.NONE) == (s.state is not SaslState.FAILED)
