"""SASL authentication of Kafka clients: PLAIN and SCRAM-SHA-256/512 (docs/security.md, "Kafka SASL").

Sans-IO: :class:`SaslSession` takes the bodies of SaslHandshake and SaslAuthenticate requests
(or, after a SaslHandshake v0, the raw tokens) and returns the answers; the listener moves the
bytes, delays answers to an address that keeps failing
(:class:`~txbroker.service.auth_throttle.AuthThrottle`) and closes the
connection after a failure, as Kafka's ``SaslServerAuthenticator`` does.

A connection moves through :data:`TRANSITIONS` (Kafka's authenticator states):

* ``HANDSHAKE``: ApiVersions and SaslHandshake only; any other request closes the connection.
* ``TOKENS``: after SaslHandshake v1, SaslAuthenticate frames carry the tokens.
* ``RAW_TOKENS``: after SaslHandshake v0, each frame is a bare token, answered by a bare one
  (what clients older than KIP-152 send).
* ``COMPLETE``: every API is served; a later SaslHandshake or SaslAuthenticate is answered
  ILLEGAL_SASL_STATE, as Kafka does on an authenticated connection.
* ``FAILED``: the failure answer is written, then the connection closes.

Re-authentication (KIP-368) is not required: SaslAuthenticate v1+ answers a session lifetime
of 0, which tells clients that the session never expires.

Why SCRAM is written out here: RFC 5802 is three messages around PBKDF2 and HMAC, which
``hashlib`` and ``hmac`` provide; every comparison of secrets goes through
``hmac.compare_digest``.  An unknown user gets a made-up credential: a salt made from the
name with a key the listener hands in (one that is the same on every broker of the cluster
and after a restart: :meth:`CredentialLookup.salt_key`), and the iteration count ``txbroker
user add`` writes, so the exchange looks the same as for a known user with a wrong password
and does not reveal who has an account.  PLAIN does the same work for both
(``Users.check_password``).
"""

from __future__ import annotations

import base64
import enum
import hashlib
import hmac
import secrets
from collections.abc import Callable
from typing import Protocol

from txbroker.remoting.kafka.apis import ApiKey
from txbroker.remoting.kafka.errors import ErrorCode
from txbroker.service.kafka.context import Handler, KafkaRequestContext
from txbroker.service.scram import (
    MECHANISMS,
    MIN_ITERATIONS,
    ScramCredentials,
    server_signature,
    unknown_user_salt,
    verify_client_proof,
)

#: Bytes of one SASL token.  A PLAIN token or a SCRAM message is a few hundred bytes; a longer
#: one is refused before it is parsed.
MAX_TOKEN_SIZE = 4096


class CredentialLookup(Protocol):
    """Where the users come from: the user store (``service/users.py``'s ``UserSource``: the
    users file, read again when it changes, or in etcd mode the cluster's store), so each
    lookup sees the store as it is now."""

    def scram_credentials(self, user: str, mechanism: str) -> ScramCredentials | None:
        """The user's credentials for a SCRAM mechanism; None for an unknown user or
        mechanism alike."""

    def check_password(self, user: str, password: str) -> bool:
        """True when ``password`` is the user's password (SASL/PLAIN), found with the same
        work for an unknown user as for a wrong password."""

    def salt_key(self) -> bytes:
        """The key an unknown user's SCRAM salt is made with: the same after a restart and on
        every broker of the cluster (empty: there is none yet)."""


class SaslState(enum.Enum):
    HANDSHAKE = "handshake"
    TOKENS = "tokens"
    RAW_TOKENS = "raw tokens"
    COMPLETE = "complete"
    FAILED = "failed"


#: state -> the states it may move to.  COMPLETE and FAILED are final.
TRANSITIONS: dict[SaslState, frozenset[SaslState]] = {
    SaslState.HANDSHAKE: frozenset({SaslState.TOKENS, SaslState.RAW_TOKENS, SaslState.FAILED}),
    SaslState.TOKENS: frozenset({SaslState.TOKENS, SaslState.COMPLETE, SaslState.FAILED}),
    SaslState.RAW_TOKENS: frozenset({SaslState.RAW_TOKENS, SaslState.COMPLETE, SaslState.FAILED}),
    SaslState.COMPLETE: frozenset(),
    SaslState.FAILED: frozenset(),
}


class IllegalSaslTransition(Exception):
    """A move the table does not allow: a bug in the caller, not the peer's fault."""


class SaslFailure(Exception):
    """The peer failed to authenticate (wrong credentials, a malformed token, a mechanism not
    offered): answered with ``code`` and ``str(self)``, then the connection closes."""

    def __init__(self, message: str, code: ErrorCode = ErrorCode.SASL_AUTHENTICATION_FAILED,
                 user: str | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.user = user


# --- mechanisms --------------------------------------------------------------------------

class _Mechanism(Protocol):
    user: str | None

    def step(self, token: bytes) -> tuple[bytes, bool]:
        """(reply, done) for one client token; SaslFailure when refused."""


class PlainServer:
    """SASL PLAIN (RFC 4616): one token ``authzid NUL user NUL password``, an empty reply."""

    def __init__(self, creds: CredentialLookup) -> None:
        self._creds = creds
        self.user: str | None = None

    def step(self, token: bytes) -> tuple[bytes, bool]:
        parts = token.split(b"\0")
        if len(parts) != 3:
            raise SaslFailure("Authentication failed: a PLAIN token is authzid NUL user NUL "
                              "password")
        try:
            authzid, user, password = (p.decode() for p in parts)
        except UnicodeDecodeError:
            raise SaslFailure("Authentication failed: PLAIN token is not UTF-8") from None
        self.user = user
        if not user or not password:
            raise SaslFailure("Authentication failed: username or password is empty", user=user)
        if authzid and authzid != user:
            raise SaslFailure("Authentication failed: Client requested an authorization id "
                              "that is different from username", user=user)
        if not self._creds.check_password(user, password):
            raise SaslFailure("Authentication failed: Invalid username or password", user=user)
        return b"", True


def _attributes(message: str, what: str) -> list[tuple[str, str]]:
    """``a=..,b=..`` into pairs, refusing anything else."""
    out = []
    for part in message.split(","):
        if len(part) < 2 or part[1] != "=" or not part[0].isalpha():
            raise SaslFailure(f"Authentication failed: malformed SCRAM {what}")
        out.append((part[0], part[2:]))
    return out


def _sasl_name(value: str) -> str:
    """RFC 5802 saslname: '=2C' is ',' and '=3D' is '='; any other '=' is malformed."""
    out = value.replace("=2C", ",").replace("=3D", "=")
    if "=" in value.replace("=2C", "").replace("=3D", ""):
        raise SaslFailure("Authentication failed: malformed SCRAM user name")
    return out


def _printable_nonce(nonce: str) -> bool:
    return bool(nonce) and all(0x21 <= ord(ch) <= 0x7E and ch != "," for ch in nonce)


def _nonce_accepted(received: str, full_nonce: str) -> bool:
    """Whether client-final's ``r=`` answers our server-first's nonce ``full_nonce`` (the
    client's nonce followed by ours).

    RFC 5802 asks for ``full_nonce`` itself.  librdkafka before 2.6.1 (Debian 12's kcat and
    confluent-kafka builds of that age) sends its own nonce once more in front of it
    (``r=`` client nonce + client nonce + server nonce: it prefixes the server-first nonce,
    which already starts with its nonce, with its nonce); Kafka 3.8.1 to 3.9 accept any
    ``r=`` that *ends* with the server-first nonce, and so do we, no more: the server's part
    must be there whole, and the proof, computed over the message as sent (``r=`` included),
    must still be right (docs/security.md, "Kafka SASL")."""
    tail = received[len(received) - len(full_nonce):] if len(received) >= len(full_nonce) else ""
    return hmac.compare_digest(tail.encode(), full_nonce.encode())


class ScramServer:
    """SCRAM-SHA-256/512 (RFC 5802, RFC 7677): client-first, server-first, client-final,
    server-final; no channel binding (gs2 flag 'n' only, as Kafka)."""

    def __init__(self, creds: CredentialLookup, mechanism: str, secret: bytes,
                 nonce: Callable[[], str] = lambda: secrets.token_urlsafe(24)) -> None:
        self._creds = creds
        self._mech = mechanism
        self._secret = secret
        self._nonce = nonce
        self._cred: ScramCredentials | None = None
        self._known = False
        self._first_bare = ""
        self._server_first = ""
        self._full_nonce = ""
        self._gs2 = ""
        self.user: str | None = None

    def step(self, token: bytes) -> tuple[bytes, bool]:
        try:
            text = token.decode()
        except UnicodeDecodeError:
            raise SaslFailure("Authentication failed: SCRAM message is not UTF-8",
                              user=self.user) from None
        if self._cred is None:
            return self._client_first(text).encode(), False
        return self._client_final(text).encode(), True

    def _client_first(self, text: str) -> str:
        if not text.startswith("n,"):
            raise SaslFailure("Authentication failed: SCRAM client-first must start with the "
                              "gs2 header 'n,' (channel binding is not supported)")
        authz, sep, bare = text[2:].partition(",")
        if not sep or (authz and not authz.startswith("a=")):
            raise SaslFailure("Authentication failed: malformed SCRAM client-first message")
        attrs = _attributes(bare, "client-first message")
        if len(attrs) < 2 or attrs[0][0] != "n" or attrs[1][0] != "r":
            raise SaslFailure("Authentication failed: malformed SCRAM client-first message")
        user = _sasl_name(attrs[0][1])
        self.user = user
        client_nonce = attrs[1][1]
        if not user or not _printable_nonce(client_nonce):
            raise SaslFailure("Authentication failed: malformed SCRAM client-first message",
                              user=user)
        if authz and _sasl_name(authz[2:]) != user:
            raise SaslFailure("Authentication failed: Client requested an authorization id "
                              "that is different from username", user=user)
        if any(k == "tokenauth" for k, _ in attrs[2:]):
            raise SaslFailure("Authentication failed: delegation tokens are not supported",
                              user=user)
        cred = self._creds.scram_credentials(user, self._mech)
        self._known = cred is not None
        if cred is None:  # carry on with a made-up credential: the final step fails
            salt = unknown_user_salt(self._secret, user, self._mech)
            cred = ScramCredentials(self._mech, salt, MIN_ITERATIONS, secrets.token_bytes(32),
                                    secrets.token_bytes(32))
        self._cred = cred
        self._first_bare = bare
        self._full_nonce = client_nonce + self._nonce()
        self._server_first = (f"r={self._full_nonce},s={base64.b64encode(cred.salt).decode()},"
                              f"i={cred.iterations}")
        self._gs2 = text[: len(text) - len(bare)]
        return self._server_first

    def _client_final(self, text: str) -> str:
        assert self._cred is not None
        attrs = _attributes(text, "client-final message")
        if len(attrs) < 3 or attrs[0][0] != "c" or attrs[1][0] != "r" or attrs[-1][0] != "p":
            raise SaslFailure("Authentication failed: malformed SCRAM client-final message",
                              user=self.user)
        try:
            binding = base64.b64decode(attrs[0][1], validate=True)
            proof = base64.b64decode(attrs[-1][1], validate=True)
        except ValueError:
            raise SaslFailure("Authentication failed: malformed SCRAM client-final message",
                              user=self.user) from None
        if not hmac.compare_digest(binding, self._gs2.encode()):
            raise SaslFailure("Authentication failed: SCRAM channel binding does not match the "
                              "gs2 header", user=self.user)
        if not _nonce_accepted(attrs[1][1], self._full_nonce):
            raise SaslFailure("Authentication failed: SCRAM nonce does not match",
                              user=self.user)
        without_proof = text[: text.rindex(",p=")]
        auth_message = f"{self._first_bare},{self._server_first},{without_proof}".encode()
        mech = self._mech
        if len(proof) != hashlib.new(MECHANISMS[mech]).digest_size:
            raise SaslFailure("Authentication failed: malformed SCRAM client proof",
                              user=self.user)
        if not (verify_client_proof(self._cred, auth_message, proof) and self._known):
            raise SaslFailure("Authentication failed during authentication due to invalid "
                              f"credentials with SASL mechanism {mech}", user=self.user)
        return "v=" + base64.b64encode(server_signature(self._cred, auth_message)).decode()


# --- one connection ----------------------------------------------------------------------

class SaslSession:
    """The authentication state of one Kafka connection (see the module docstring).

    ``plain_allowed`` is decided per connection by the listener: true on a TLS connection,
    on a plaintext one only with ``kafka_sasl_plain_over_plaintext``; PLAIN is neither
    offered nor accepted without it."""

    def __init__(self, mechanisms: tuple[str, ...], creds: CredentialLookup, secret: bytes,
                 plain_allowed: bool) -> None:
        self.mechanisms = mechanisms
        self._creds = creds
        self._secret = secret
        self._plain_allowed = plain_allowed
        self.state = SaslState.HANDSHAKE
        self.mechanism: str | None = None
        self._server: _Mechanism | None = None
        #: The refusal that ended the session, for the log.
        self.failure: SaslFailure | None = None

    @property
    def user(self) -> str | None:
        return self._server.user if self._server is not None else None

    @property
    def authenticated(self) -> bool:
        return self.state is SaslState.COMPLETE

    def _move(self, to: SaslState) -> None:
        if to not in TRANSITIONS[self.state]:
            raise IllegalSaslTransition(f"SASL state {self.state.value} -> {to.value}")
        self.state = to

    def _fail(self, failure: SaslFailure) -> None:
        self.failure = failure
        self._move(SaslState.FAILED)

    def allows(self, api_key: int) -> bool:
        """Whether a request of ``api_key`` may be read in the current state (any other
        closes the connection, as Kafka does)."""
        if self.state is SaslState.COMPLETE:
            return True
        if self.state is SaslState.HANDSHAKE:
            return api_key in (ApiKey.API_VERSIONS, ApiKey.SASL_HANDSHAKE)
        return self.state is SaslState.TOKENS and api_key == ApiKey.SASL_AUTHENTICATE

    def handshake(self, version: int, body: dict) -> dict:
        """A SaslHandshake answer; a mechanism not offered is UNSUPPORTED_SASL_MECHANISM and
        ends the session."""
        mech = body["mechanism"]
        offered = [m for m in self.mechanisms if m != "PLAIN" or self._plain_allowed]
        if mech not in self.mechanisms:
            self._fail(SaslFailure(f"Unsupported SASL mechanism {mech}",
                                   ErrorCode.UNSUPPORTED_SASL_MECHANISM))
            return {"error_code": ErrorCode.UNSUPPORTED_SASL_MECHANISM, "mechanisms": offered}
        if mech == "PLAIN" and not self._plain_allowed:
            self._fail(SaslFailure("PLAIN sends the password in the clear: it is offered on TLS "
                                   "connections, and on plaintext ones only with "
                                   "kafka_sasl_plain_over_plaintext",
                                   ErrorCode.UNSUPPORTED_SASL_MECHANISM))
            return {"error_code": ErrorCode.UNSUPPORTED_SASL_MECHANISM, "mechanisms": offered}
        self.mechanism = mech
        self._server = (PlainServer(self._creds) if mech == "PLAIN"
                        else ScramServer(self._creds, mech, self._secret))
        self._move(SaslState.TOKENS if version >= 1 else SaslState.RAW_TOKENS)
        return {"error_code": ErrorCode.NONE, "mechanisms": offered}

    def token(self, token: bytes) -> bytes:
        """The reply to one raw token (after SaslHandshake v0); SaslFailure ends the session."""
        assert self._server is not None
        if len(token) > MAX_TOKEN_SIZE:
            self._fail(SaslFailure(f"Authentication failed: SASL token of {len(token)} bytes "
                                   f"(maximum {MAX_TOKEN_SIZE})", user=self.user))
            raise self.failure  # type: ignore[misc]
        try:
            reply, done = self._server.step(token)
        except SaslFailure as failure:
            self._fail(failure)
            raise
        self._move(SaslState.COMPLETE if done else self.state)
        return reply

    def authenticate(self, version: int, body: dict) -> dict:
        """A SaslAuthenticate answer: the server token, or SASL_AUTHENTICATION_FAILED with the
        reason (the session then ends).  Lifetime 0: no re-authentication required."""
        try:
            reply = self.token(body["auth_bytes"])
        except SaslFailure as failure:
            return {"error_code": failure.code, "error_message": str(failure),
                    "auth_bytes": b"", "session_lifetime_ms": 0}
        return {"error_code": ErrorCode.NONE, "error_message": None, "auth_bytes": reply,
                "session_lifetime_ms": 0}


def authenticated_handlers() -> dict[int, Handler]:
    """SaslHandshake and SaslAuthenticate on a connection that needs no (more)
    authentication: ILLEGAL_SASL_STATE, as Kafka answers them."""

    async def handshake(ctx: KafkaRequestContext, body: dict) -> dict:
        return {"error_code": ErrorCode.ILLEGAL_SASL_STATE, "mechanisms": []}

    async def authenticate(ctx: KafkaRequestContext, body: dict) -> dict:
        return {"error_code": ErrorCode.ILLEGAL_SASL_STATE,
                "error_message": "SaslAuthenticate request received after successful "
                                 "authentication", "auth_bytes": b"", "session_lifetime_ms": 0}

    return {ApiKey.SASL_HANDSHAKE: handshake, ApiKey.SASL_AUTHENTICATE: authenticate}
