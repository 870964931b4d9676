"""Brokers logging in to each other's Kafka ports: the cluster's own SASL account
(docs/security.md, "Kafka SASL", "Between brokers").

A broker sends requests to other broker groups' Kafka listeners (forwarded admin requests,
``cluster_admin.py``; transaction markers, ``markers.py``).  With ``kafka_sasl_mechanisms`` set
those listeners serve nothing to a connection that has not authenticated, so a broker logs in
first, as the reserved user :data:`CLUSTER_USER` whose password is ``cluster_secret``:

* **Server side**, :class:`ClusterAccount` answers the listener's credential lookup for that
  user from the secret (SCRAM credentials derived once, with the fixed salt of
  :data:`CLUSTER_SALTS`, so every broker of the cluster holds the same ones without sharing a
  file) and hands every other user to the user store; a user of that name in the store is
  never consulted.  Authorization treats ``User:txbroker-cluster`` as a super user
  (``authorize.py``).  Without a secret the account does not exist.
* **Client side**, :func:`authenticate` runs SaslHandshake v1 and SaslAuthenticate v1 on a
  connection just opened, choosing SCRAM-SHA-512, else SCRAM-SHA-256, else PLAIN among this
  broker's own mechanisms (the brokers of one cluster share their settings), and checks the
  server's SCRAM signature, so a peer that does not know the secret is not trusted either.

The forwarded requests and markers keep the cluster envelope in the client id
(``peer_envelope.py``): the login says who connects, the envelope still covers what is asked,
and that it is asked now and once.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import itertools
import logging
import secrets

from txbroker.config import BrokerConfig
from txbroker.remoting.kafka.apis import ApiKey
from txbroker.remoting.kafka.errors import ErrorCode
from txbroker.remoting.kafka.framing import decode_response, encode_request
from txbroker.service.cluster_auth import CLUSTER_ACCESS_KEY, OncePerPeer
from txbroker.service.kafka.sasl import CredentialLookup
from txbroker.service.scram import (
    MECHANISMS,
    ScramCredentials,
    client_proof,
    make_credentials,
)

log = logging.getLogger("txbroker.kafka")

#: The cluster's account name; ``txbroker user add`` refuses it.
CLUSTER_USER = CLUSTER_ACCESS_KEY
CLUSTER_PRINCIPAL = f"User:{CLUSTER_USER}"
#: Fixed salts of the cluster account's SCRAM credentials: every broker derives the same
#: credentials from the secret alone, with nothing else to share.  The price: one guess of the
#: secret is tried against every cluster at once, so the secret must be long and random.
CLUSTER_SALTS = {mech: f"txbroker-cluster {mech}".encode() for mech in MECHANISMS}
#: Preference among this broker's mechanisms: the strongest first.
PREFERENCE = ("SCRAM-SHA-512", "SCRAM-SHA-256", "PLAIN")
#: SaslHandshake v1 (tokens in SaslAuthenticate, KIP-152) and SaslAuthenticate v1 (the
#: session lifetime of KIP-368, not flexible): what librdkafka and aiokafka send.
HANDSHAKE_VERSION = 1
AUTHENTICATE_VERSION = 1
#: Largest SASL answer read from a peer: a SCRAM message is a few hundred bytes.
MAX_SASL_ANSWER = 64 * 1024

_corr = itertools.count(1)


class ClusterAccount:
    """The Kafka listener's :class:`~txbroker.service.kafka.sasl.CredentialLookup`: the
    cluster user from ``cluster_secret``, every other user from ``users``.  Immutable."""

    def __init__(self, users: CredentialLookup, secret: str | None) -> None:
        self._users = users
        #: Computed once: PBKDF2 per login would cost every forwarded request.
        self._scram: dict[str, ScramCredentials] = {} if secret is None else {
            mech: make_credentials(mech, secret, CLUSTER_SALTS[mech]) for mech in MECHANISMS}
        self._secret_digest = None if secret is None else hashlib.sha256(secret.encode()).digest()
        #: With a secret, unknown users' salts are keyed from it: every broker of the cluster
        #: has it (a SASL cluster broker must), whatever users file each one reads.
        self._salt_key = b"" if secret is None else hmac.digest(
            secret.encode(), b"txbroker unknown-user SCRAM salts", "sha256")

    def scram_credentials(self, user: str, mechanism: str) -> ScramCredentials | None:
        if user == CLUSTER_USER:
            return self._scram.get(mechanism)
        return self._users.scram_credentials(user, mechanism)

    def check_password(self, user: str, password: str) -> bool:
        if user == CLUSTER_USER:
            # Digests of equal length: the comparison does not even tell the secret's length.
            return self._secret_digest is not None and hmac.compare_digest(
                hashlib.sha256(password.encode()).digest(), self._secret_digest)
        return self._users.check_password(user, password)

    def salt_key(self) -> bytes:
        return self._salt_key or self._users.salt_key()


class PeerAuthError(ValueError):
    """The peer refused this broker's login, or failed to prove it knows the secret; the
    message says why (a ValueError: the callers treat it as a peer they could not use)."""


class ScramClient:
    """SCRAM's client side (RFC 5802 section 3), sans-IO: :meth:`first`, then :meth:`final`
    on the server-first message, then :meth:`verify` on the server-final message.  No channel
    binding (gs2 header ``n,,``), as Kafka."""

    def __init__(self, mechanism: str, user: str, password: str) -> None:
        self.mechanism = mechanism
        self._password = password
        name = user.replace("=", "=3D").replace(",", "=2C")
        self._nonce = secrets.token_urlsafe(24)
        self._first_bare = f"n={name},r={self._nonce}"
        self._expected = b""

    def first(self) -> bytes:
        """client-first-message."""
        return f"n,,{self._first_bare}".encode()

    def final(self, server_first: bytes) -> bytes:
        """client-final-message (with the proof) for ``server_first``."""
        try:
            text = server_first.decode()
            attrs = dict(part.split("=", 1) for part in text.split(","))
            nonce, salt = attrs["r"], base64.b64decode(attrs["s"], validate=True)
            iterations = int(attrs["i"])
        except (UnicodeDecodeError, ValueError, KeyError) as exc:
            raise PeerAuthError(f"malformed SCRAM server-first message ({exc})") from None
        if not nonce.startswith(self._nonce) or len(nonce) == len(self._nonce):
            raise PeerAuthError("the SCRAM server nonce does not extend ours")
        without_proof = f"c=biws,r={nonce}"
        auth_message = f"{self._first_bare},{text},{without_proof}".encode()
        try:
            proof, self._expected = client_proof(self.mechanism, self._password, salt,
                                                 iterations, auth_message)
        except ValueError as exc:
            raise PeerAuthError(f"SCRAM server-first message: {exc}") from None
        return f"{without_proof},p={base64.b64encode(proof).decode()}".encode()

    def verify(self, server_final: bytes) -> None:
        """PeerAuthError unless ``server_final`` carries the signature only a holder of the
        password's ServerKey can make."""
        expected = b"v=" + base64.b64encode(self._expected)
        if not self._expected or not hmac.compare_digest(server_final, expected):
            raise PeerAuthError("its SCRAM server signature does not match: it does not hold "
                                "this cluster_secret (a different cluster_secret, or not a "
                                "broker of this cluster?)")


def choose_mechanism(mechanisms: tuple[str, ...]) -> str:
    """The mechanism a broker logs in with, among its own ``kafka_sasl_mechanisms``."""
    return next(m for m in PREFERENCE if m in mechanisms)


async def _call(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, api_key: int,
                version: int, body: dict) -> dict:
    corr = next(_corr) & 0x7FFFFFFF
    writer.write(encode_request(api_key, version, corr, CLUSTER_USER, body))
    size = int.from_bytes(await reader.readexactly(4), "big", signed=True)
    if not 0 < size <= MAX_SASL_ANSWER:
        raise PeerAuthError(f"a SASL answer of {size} bytes")
    got, answer = decode_response(api_key, version, await reader.readexactly(size))
    if got != corr:
        raise PeerAuthError("a SASL answer to another request")
    return answer


async def _authenticate_step(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                             token: bytes) -> bytes:
    answer = await _call(reader, writer, ApiKey.SASL_AUTHENTICATE, AUTHENTICATE_VERSION,
                         {"auth_bytes": token})
    if answer["error_code"] != ErrorCode.NONE:
        raise PeerAuthError(f"{answer.get('error_message') or ErrorCode(answer['error_code']).name}"
                            f" (a different cluster_secret there?)")
    return answer["auth_bytes"]


async def _login(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, mech: str,
                 secret: str) -> None:
    answer = await _call(reader, writer, ApiKey.SASL_HANDSHAKE, HANDSHAKE_VERSION,
                         {"mechanism": mech})
    code = answer["error_code"]
    if code == ErrorCode.ILLEGAL_SASL_STATE:
        raise PeerAuthError("its Kafka port does not use SASL (kafka_sasl_mechanisms differ "
                            "between brokers of the cluster?)")
    if code != ErrorCode.NONE:
        raise PeerAuthError(f"it does not offer {mech} (it offers "
                            f"{', '.join(answer.get('mechanisms') or ()) or 'none'}): the "
                            f"brokers of a cluster need the same kafka_sasl_mechanisms")
    if mech == "PLAIN":
        await _authenticate_step(reader, writer, f"\0{CLUSTER_USER}\0{secret}".encode())
        return
    client = ScramClient(mech, CLUSTER_USER, secret)
    server_first = await _authenticate_step(reader, writer, client.first())
    server_final = await _authenticate_step(reader, writer, client.final(server_first))
    client.verify(server_final)


async def authenticate(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                       config: BrokerConfig, said: OncePerPeer | None = None) -> None:
    """Log in as the cluster account on a connection to a peer's Kafka listener just opened;
    nothing when this broker has no ``kafka_sasl_mechanisms``.  A refusal is logged (through
    ``said``, once per peer and reason, when given) and raised as :class:`PeerAuthError`; on
    any failure the connection is closed."""
    mechanisms = config.kafka_sasl_mechanism_list()
    if not mechanisms:
        return
    mech = choose_mechanism(mechanisms)
    try:
        if config.cluster_secret is None:  # the config check stops a cluster broker before
            raise PeerAuthError("no cluster_secret is set here")
        await _login(reader, writer, mech, config.cluster_secret)
    except PeerAuthError as exc:
        writer.close()
        peer = writer.get_extra_info("peername")
        addr = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer)
        line = f"logging in to Kafka peer {addr} as {CLUSTER_USER!r} ({mech}) failed: {exc}"
        if said is None:
            log.warning("%s", line)
        else:
            said(addr.rpartition(":")[0], line, str(exc))
        raise
    except BaseException:
        writer.close()
        raise
