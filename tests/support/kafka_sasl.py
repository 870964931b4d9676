"""Kafka SASL from the client side, written from RFC 5802 independently of the broker's code,
so a test checks the broker against the RFC rather than against itself."""

from __future__ import annotations

import base64
import hashlib
import hmac
from pathlib import Path

from txbroker.service.users import Users, write_users


def users_file(path: Path, roles: tuple[str, ...] = (), **passwords: str) -> str:
    """A user store at ``path`` with these users and passwords, each with ``roles`` (as
    ``txbroker user add`` writes it); returns the path for ``users_file``."""
    users = Users()
    for user, password in passwords.items():
        users = users.with_password(user, password, roles)
    write_users(path, users)
    return str(path)


def scram_client(mechanism: str, user: str, password: str, server_first: bytes,
                 client_first_bare: str, nonce: str | None = None) -> tuple[bytes, bytes]:
    """RFC 5802 section 3, client side: (client-final, expected server signature).

    ``nonce`` is the ``r=`` sent back instead of the server-first one (the proof is computed
    over the message as sent, as a client that sends another nonce computes it)."""
    alg = {"SCRAM-SHA-256": "sha256", "SCRAM-SHA-512": "sha512"}[mechanism]
    attrs = dict(p.split("=", 1) for p in server_first.decode().split(","))
    salted = hashlib.pbkdf2_hmac(alg, password.encode(), base64.b64decode(attrs["s"]),
                                 int(attrs["i"]))
    client_key = hmac.new(salted, b"Client Key", alg).digest()
    stored = hashlib.new(alg, client_key).digest()
    without_proof = f"c=biws,r={attrs['r'] if nonce is None else nonce}"
    auth = f"{client_first_bare},{server_first.decode()},{without_proof}".encode()
    sig = hmac.new(stored, auth, alg).digest()
    proof = bytes(a ^ b for a, b in zip(client_key, sig, strict=True))
    server_key = hmac.new(salted, b"Server Key", alg).digest()
    final = f"{without_proof},p={base64.b64encode(proof).decode()}".encode()
    return final, b"v=" + base64.b64encode(hmac.new(server_key, auth, alg).digest())
