"""The client's side of SCRAM (RFC 5802 section 3), written out apart from the broker's code so
tests check the server's verifier against an independent computation."""

from __future__ import annotations

import hashlib
import hmac

from txbroker.service.scram import ScramCredentials

_DIGESTS = {"SCRAM-SHA-256": "sha256", "SCRAM-SHA-512": "sha512"}


def client_proof(password: str, creds: ScramCredentials, auth_message: bytes) -> bytes:
    """ClientKey XOR HMAC(H(ClientKey), AuthMessage), from the password and the server's salt."""
    digest = _DIGESTS[creds.mechanism]
    salted = hashlib.pbkdf2_hmac(digest, password.encode(), creds.salt, creds.iterations)
    client_key = hmac.digest(salted, b"Client Key", digest)
    signature = hmac.digest(hashlib.new(digest, client_key).digest(), auth_message, digest)
    return bytes(a ^ b for a, b in zip(client_key, signature, strict=True))
