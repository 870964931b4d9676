"""Kafka SASL users: SCRAM credentials (RFC 5802 section 3) and where they are looked up
(docs/security.md, "Kafka SASL").

A server keeps, per user and mechanism, the salt, the iteration count, StoredKey and
ServerKey: enough to check a SCRAM proof or a PLAIN password, not enough to log in as the
user.  :class:`CredentialLookup` is what the SASL mechanisms need; :class:`FileCredentials`
is the JSON file ``txbroker serve --kafka-sasl-credentials`` reads."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

#: Hash of each SCRAM mechanism (RFC 7677 and Kafka's SCRAM-SHA-512).
_SCRAM_HASH = {"SCRAM-SHA-256": "sha256", "SCRAM-SHA-512": "sha512"}
#: Iterations of a SCRAM credential: RFC 7677's minimum, and Kafka's bounds.
MIN_ITERATIONS = 4096
MAX_ITERATIONS = 16384


@dataclass(frozen=True, slots=True)
class ScramCredential:
    """What a server keeps of a SCRAM password (RFC 5802 section 3): never the password."""

    salt: bytes
    iterations: int
    stored_key: bytes
    server_key: bytes


class CredentialLookup(Protocol):
    """Where the users come from (a user store, or :class:`FileCredentials`)."""

    def scram(self, user: str, mechanism: str) -> ScramCredential | None:
        """The user's credential for a SCRAM mechanism, None when there is none."""

    def plain(self, user: str, password: str) -> bool:
        """True when ``password`` is the user's password."""


def _salted(password: str, mechanism: str, salt: bytes, iterations: int) -> bytes:
    return hashlib.pbkdf2_hmac(_SCRAM_HASH[mechanism], password.encode(), salt, iterations)


def hmac_digest(mechanism: str, key: bytes, msg: bytes) -> bytes:
    return hmac.new(key, msg, _SCRAM_HASH[mechanism]).digest()


def scram_hash(mechanism: str, data: bytes) -> bytes:
    return hashlib.new(_SCRAM_HASH[mechanism], data).digest()


def scram_credential(password: str, mechanism: str, iterations: int = MIN_ITERATIONS,
                     salt: bytes | None = None) -> ScramCredential:
    """A SCRAM credential for ``password`` (RFC 5802: SaltedPassword, ClientKey, StoredKey,
    ServerKey)."""
    if mechanism not in _SCRAM_HASH:
        raise ValueError(f"{mechanism!r} is not a SCRAM mechanism")
    if not MIN_ITERATIONS <= iterations <= MAX_ITERATIONS:
        raise ValueError(f"iterations={iterations}: must be {MIN_ITERATIONS}..{MAX_ITERATIONS}")
    salt = secrets.token_bytes(32) if salt is None else salt
    salted = _salted(password, mechanism, salt, iterations)
    stored = scram_hash(mechanism, hmac_digest(mechanism, salted, b"Client Key"))
    return ScramCredential(salt, iterations, stored, hmac_digest(mechanism, salted, b"Server Key"))


def verify_password(cred: ScramCredential, mechanism: str, password: str) -> bool:
    """True when ``password`` derives ``cred`` (how PLAIN is checked without a clear password)."""
    salted = _salted(password, mechanism, cred.salt, cred.iterations)
    stored = scram_hash(mechanism, hmac_digest(mechanism, salted, b"Client Key"))
    return hmac.compare_digest(stored, cred.stored_key)


class FileCredentials:
    """Users from a JSON file ``{"users": {name: {mechanism: {"salt", "iterations",
    "stored_key", "server_key"}}}}`` (bytes in base64), as :func:`credentials_entry` writes
    them.  Read once, at start."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        try:
            doc = json.loads(self.path.read_text())
            self._users: dict[str, dict[str, ScramCredential]] = {
                user: {mech: ScramCredential(base64.b64decode(c["salt"]), int(c["iterations"]),
                                             base64.b64decode(c["stored_key"]),
                                             base64.b64decode(c["server_key"]))
                       for mech, c in mechs.items() if mech in _SCRAM_HASH}
                for user, mechs in doc["users"].items()}
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            raise ValueError(f"Kafka SASL credentials file {self.path}: cannot read it: "
                             f"{exc}") from None

    def scram(self, user: str, mechanism: str) -> ScramCredential | None:
        return self._users.get(user, {}).get(mechanism)

    def plain(self, user: str, password: str) -> bool:
        return any(verify_password(cred, mech, password)
                   for mech, cred in self._users.get(user, {}).items())


def credentials_entry(password: str, mechanisms: tuple[str, ...] = ("SCRAM-SHA-256",
                                                                      "SCRAM-SHA-512"),
                      iterations: int = MIN_ITERATIONS) -> dict[str, dict]:
    """One user's entry of a :class:`FileCredentials` file."""
    out = {}
    for mech in mechanisms:
        c = scram_credential(password, mech, iterations)
        out[mech] = {"salt": base64.b64encode(c.salt).decode(), "iterations": c.iterations,
                     "stored_key": base64.b64encode(c.stored_key).decode(),
                     "server_key": base64.b64encode(c.server_key).decode()}
    return out
