"""Request signatures of RocketMQ 4.x session credentials (pure: no I/O, no logging).

A client configured with an access key and a secret key (Java ``AclClientRPCHook``, C++
``ClientRPCHook``) adds two ext fields to every request it sends: ``AccessKey`` and
``Signature``.  The signature is ``base64(HMAC-SHA1(secretKey, content))`` where the content is
the *values* of every ext field except ``Signature`` (and ``_UNIQUE_KEY_QUERY``, which the Java
client adds after signing), in the order of their keys as Java's ``TreeMap`` sorts them (UTF-16
code units), UTF-8 encoded, followed by the request body.  The broker recomputes the same
content from the frame it received, so the client and the broker share this one function:
``txbroker.client`` signs with it and ``txbroker.service.acl`` verifies with it.

The C++ client also sends ``OnsChannel`` (``"ALIYUN"``) and signs even with empty
credentials; that is how its captured frames serve as golden vectors for this code.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
from collections.abc import Mapping
from dataclasses import dataclass

from txbroker.remoting.command import RemotingCommand

ACCESS_KEY = "AccessKey"
SIGNATURE = "Signature"
SECURITY_TOKEN = "SecurityToken"
#: Added by the Java client's QUERY_MESSAGE after signing; never part of the content.
UNIQUE_KEY_QUERY = "_UNIQUE_KEY_QUERY"
_UNSIGNED = frozenset((SIGNATURE, UNIQUE_KEY_QUERY))


def _java_order(key: str) -> bytes:
    # Big-endian UTF-16 bytes compare exactly as Java compares strings (by code unit); Python
    # compares code points, which differs for characters above U+FFFF.
    return key.encode("utf-16-be", "surrogatepass")


def signed_content(ext_fields: Mapping[str, str], body: bytes) -> bytes:
    """The bytes a signature covers: sorted ext values (without Signature) + body."""
    values = "".join(ext_fields[k] for k in sorted(ext_fields, key=_java_order) if k not in _UNSIGNED)
    return values.encode("utf-8", "surrogatepass") + body


def signature(secret_key: str, ext_fields: Mapping[str, str], body: bytes) -> str:
    """``base64(HMAC-SHA1(secret_key, signed_content(...)))``, as RocketMQ's AclUtils computes it."""
    mac = hmac.new(secret_key.encode("utf-8"), signed_content(ext_fields, body), hashlib.sha1)
    return base64.b64encode(mac.digest()).decode("ascii")


@dataclass(frozen=True)
class SessionCredentials:
    """An access key and its secret (RocketMQ's ``SessionCredentials``); signs requests."""

    access_key: str
    secret_key: str

    def __post_init__(self) -> None:
        for name in ("access_key", "secret_key"):
            value = getattr(self, name)
            if not isinstance(value, str) or not value:
                raise ValueError(f"{name} must be a non-empty string")

    def __repr__(self) -> str:  # never print the secret
        return f"SessionCredentials(access_key={self.access_key!r})"

    def sign(self, cmd: RemotingCommand) -> None:
        """Add ``AccessKey`` and ``Signature`` to ``cmd``; call after every other ext field is set."""
        cmd.ext_fields[ACCESS_KEY] = self.access_key
        cmd.ext_fields[SIGNATURE] = signature(self.secret_key, cmd.ext_fields, cmd.body)


def credentials(access_key: str | None, secret_key: str | None) -> SessionCredentials | None:
    """Credentials from two optional values: both or neither (a half-configured client is a bug)."""
    if access_key is None and secret_key is None:
        return None
    if access_key is None or secret_key is None:
        raise ValueError("access_key and secret_key must be given together")
    return SessionCredentials(access_key, secret_key)
