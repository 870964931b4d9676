"""SCRAM credentials and the server's checks (RFC 5802 section 3, RFC 7677): pure, no I/O.

A user's password is never kept: what the user store holds per mechanism is what RFC 5802
lets a server verify a client with, and nothing a client could log in with::

    SaltedPassword  = PBKDF2(HMAC-H, password, salt, iterations)     (Hi() of RFC 5802)
    ClientKey       = HMAC(SaltedPassword, "Client Key")
    StoredKey       = H(ClientKey)
    ServerKey       = HMAC(SaltedPassword, "Server Key")

and during an exchange, with AuthMessage = client-first-bare + "," + server-first + "," +
client-final-without-proof::

    ClientSignature = HMAC(StoredKey, AuthMessage)
    ClientKey       = ClientProof XOR ClientSignature     -> H(ClientKey) must equal StoredKey
    ServerSignature = HMAC(ServerKey, AuthMessage)        -> sent back so the client checks us

Kafka's SCRAM-SHA-256 and SCRAM-SHA-512 (KIP-84) use exactly these with SHA-256 and SHA-512 and
accept 4096 to 16384 iterations, 4096 being the minimum RFC 7677 asks for.  Parsing the SCRAM
messages themselves belongs to the SASL exchange, not here.  The client's side of the same
math (:func:`client_proof`) is here too, for the broker that logs in to another broker's Kafka
port (``service/kafka/peer_auth.py``).
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass, field

#: Mechanism name (as Kafka clients send it in SaslHandshake) -> hashlib name.
MECHANISMS = {"SCRAM-SHA-256": "sha256", "SCRAM-SHA-512": "sha512"}
#: RFC 7677's minimum and Kafka's; also the default.
MIN_ITERATIONS = 4096
#: Kafka's ``ScramMechanism`` maximum: more costs every login without a matching client.
MAX_ITERATIONS = 16384
#: Random salt bytes per credential: 256 bits, so no two credentials share a salt and two users
#: with one password have nothing in common in the file.
SALT_BYTES = 32


@dataclass(frozen=True)
class ScramCredentials:
    """What a server keeps for one user and one mechanism (Kafka's ``ScramCredential``)."""

    mechanism: str
    salt: bytes
    iterations: int
    stored_key: bytes = field(repr=False)
    server_key: bytes = field(repr=False)


def _digest(mechanism: str) -> str:
    try:
        return MECHANISMS[mechanism]
    except KeyError:
        raise ValueError(f"unknown SCRAM mechanism {mechanism!r} "
                         f"(known: {', '.join(MECHANISMS)})") from None


def make_credentials(mechanism: str, password: str, salt: bytes | None = None,
                     iterations: int = MIN_ITERATIONS) -> ScramCredentials:
    """The stored form of ``password`` for ``mechanism``; a fresh random salt unless given.

    The password is normalised as the bytes of its UTF-8 text (Kafka's ``ScramFormatter``
    does the same; SASLprep is not applied, so keep passwords to printable characters).
    """
    digest = _digest(mechanism)
    if not MIN_ITERATIONS <= iterations <= MAX_ITERATIONS:
        raise ValueError(f"iterations={iterations}: must be {MIN_ITERATIONS}..{MAX_ITERATIONS}")
    if salt is None:
        salt = secrets.token_bytes(SALT_BYTES)
    salted = hashlib.pbkdf2_hmac(digest, password.encode("utf-8"), salt, iterations)
    client_key = hmac.digest(salted, b"Client Key", digest)
    return ScramCredentials(
        mechanism=mechanism, salt=salt, iterations=iterations,
        stored_key=hashlib.new(digest, client_key).digest(),
        server_key=hmac.digest(salted, b"Server Key", digest),
    )


def verify_client_proof(credentials: ScramCredentials, auth_message: bytes,
                        client_proof: bytes) -> bool:
    """Whether ``client_proof`` shows the client knows the password behind ``credentials``.

    A proof of the wrong length is simply wrong (False), never an exception: it comes from
    the peer.  The final comparison takes constant time.
    """
    digest = _digest(credentials.mechanism)
    signature = hmac.digest(credentials.stored_key, auth_message, digest)
    if len(client_proof) != len(signature):
        return False
    client_key = bytes(p ^ s for p, s in zip(client_proof, signature, strict=True))
    return hmac.compare_digest(hashlib.new(digest, client_key).digest(), credentials.stored_key)


def server_signature(credentials: ScramCredentials, auth_message: bytes) -> bytes:
    """The ``v=`` of server-final-message: proves to the client that we hold its ServerKey."""
    return hmac.digest(credentials.server_key, auth_message, _digest(credentials.mechanism))


def verify_password(credentials: ScramCredentials, password: str) -> bool:
    """Whether ``password`` derives ``credentials``: how SASL/PLAIN is checked with no password
    kept (the salted derivation is recomputed and its StoredKey compared in constant time)."""
    again = make_credentials(credentials.mechanism, password, credentials.salt,
                             credentials.iterations)
    return hmac.compare_digest(again.stored_key, credentials.stored_key)


def unknown_user_salt(key: bytes, user: str, mechanism: str) -> bytes:
    """The salt a server answers for a ``user`` with no credentials, keyed by ``key``: the same
    name gets the same salt wherever the key is the same (every broker of a cluster, after any
    restart), as a real account's salt stays, so the answer does not tell the two apart; as
    long as a real salt (:data:`SALT_BYTES`)."""
    return hmac.digest(key, f"{mechanism}\0{user}".encode(), "sha256")[:SALT_BYTES]


def client_proof(mechanism: str, password: str, salt: bytes, iterations: int,
                 auth_message: bytes) -> tuple[bytes, bytes]:
    """The client's side: (ClientProof for client-final-message, the ServerSignature the
    server must answer with).  The salt and iteration count come from the server, so an
    iteration count out of :data:`MIN_ITERATIONS`..:data:`MAX_ITERATIONS` is a ValueError
    (a peer must not make the client derive weakly, or for minutes)."""
    digest = _digest(mechanism)
    if not MIN_ITERATIONS <= iterations <= MAX_ITERATIONS:
        raise ValueError(f"iterations={iterations}: must be {MIN_ITERATIONS}..{MAX_ITERATIONS}")
    salted = hashlib.pbkdf2_hmac(digest, password.encode("utf-8"), salt, iterations)
    client_key = hmac.digest(salted, b"Client Key", digest)
    signature = hmac.digest(hashlib.new(digest, client_key).digest(), auth_message, digest)
    proof = bytes(k ^ s for k, s in zip(client_key, signature, strict=True))
    server_key = hmac.digest(salted, b"Server Key", digest)
    return proof, hmac.digest(server_key, auth_message, digest)
