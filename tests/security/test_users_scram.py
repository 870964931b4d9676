"""SCRAM credential math against RFC 7677's SCRAM-SHA-256 example, checked byte for byte."""

from __future__ import annotations

import base64
import hashlib
import hmac

import pytest
from support.scram_client import client_proof

from txbroker.service.scram import (
    MIN_ITERATIONS,
    make_credentials,
    server_signature,
    verify_client_proof,
)

# RFC 7677 section 3: user "user", password "pencil".
CLIENT_FIRST_BARE = "n=user,r=rOprNGfwEbeRWgbNEkqO"
SERVER_FIRST = ("r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,"
                "s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096")
CLIENT_FINAL_NO_PROOF = "c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0"
AUTH_MESSAGE = f"{CLIENT_FIRST_BARE},{SERVER_FIRST},{CLIENT_FINAL_NO_PROOF}".encode()
SALT = base64.b64decode("W22ZaJ0SNY7soEsUEjb6gQ==")
PROOF = base64.b64decode("dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ=")
SERVER_SIGNATURE = base64.b64decode("6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4=")


@pytest.fixture(scope="module")
def rfc_credentials():
    return make_credentials("SCRAM-SHA-256", "pencil", SALT, 4096)


def test_rfc7677_client_proof_verifies(rfc_credentials) -> None:
    assert verify_client_proof(rfc_credentials, AUTH_MESSAGE, PROOF)


def test_rfc7677_server_signature_is_exact(rfc_credentials) -> None:
    assert server_signature(rfc_credentials, AUTH_MESSAGE) == SERVER_SIGNATURE


def test_rfc7677_stored_and_server_keys(rfc_credentials) -> None:
    # The definitions of RFC 5802 section 3, worked out independently.
    salted = hashlib.pbkdf2_hmac("sha256", b"pencil", SALT, 4096)
    client_key = hmac.digest(salted, b"Client Key", "sha256")
    assert rfc_credentials.stored_key == hashlib.sha256(client_key).digest()
    assert rfc_credentials.server_key == hmac.digest(salted, b"Server Key", "sha256")


def test_wrong_password_proof_or_message_is_refused(rfc_credentials) -> None:
    wrong = make_credentials("SCRAM-SHA-256", "pencil2", SALT, 4096)
    assert not verify_client_proof(wrong, AUTH_MESSAGE, PROOF)
    tampered = bytes([PROOF[0] ^ 1]) + PROOF[1:]
    assert not verify_client_proof(rfc_credentials, AUTH_MESSAGE, tampered)
    assert not verify_client_proof(rfc_credentials, AUTH_MESSAGE + b"x", PROOF)
    assert not verify_client_proof(rfc_credentials, AUTH_MESSAGE, PROOF[:-1])  # no exception
    assert not verify_client_proof(rfc_credentials, AUTH_MESSAGE, b"")



def test_sha512_round_trip_with_a_random_salt() -> None:
    creds = make_credentials("SCRAM-SHA-512", "s3cret")
    assert len(creds.salt) == 32 and creds.iterations == MIN_ITERATIONS
    assert len(creds.stored_key) == len(creds.server_key) == 64
    message = b"n=alice,r=abc,r=abcdef,s=xx,i=4096,c=biws,r=abcdef"
    assert verify_client_proof(creds, message, client_proof("s3cret", creds, message))
    assert not verify_client_proof(creds, message, client_proof("s3creT", creds, message))
    assert make_credentials("SCRAM-SHA-512", "s3cret").salt != creds.salt


def test_bad_mechanism_and_iterations_are_refused() -> None:
    with pytest.raises(ValueError, match="unknown SCRAM mechanism 'SCRAM-SHA-1'"):
        make_credentials("SCRAM-SHA-1", "x")
    with pytest.raises(ValueError, match="iterations=4095"):
        make_credentials("SCRAM-SHA-256", "x", iterations=4095)


def test_repr_shows_no_key(rfc_credentials) -> None:
    text = repr(rfc_credentials)
    assert rfc_credentials.stored_key.hex() not in text and "stored_key" not in text
