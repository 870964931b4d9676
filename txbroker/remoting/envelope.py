"""The cluster envelope: how one node proves to another that a request or an answer comes
from a holder of ``cluster_secret``, was made just now, and has not been seen before
(pure: no I/O, no logging, the clock passed in).  docs/cluster.md, "Links between nodes".

Why not RocketMQ's request signature (:mod:`.signing`), which the cluster links used before:
it is an HMAC over the ext *values* run together, without their names, and nothing else.  So
bytes could move from one field to the next and still verify (a heartbeat's ``epoch`` and
``heartbeatTimeoutMills``), a captured request could be sent again at any later time (a dead
master's heartbeat kept it alive at the controller), and an answer said nothing of the
request it answered (one recorded SUCCESS served every later heartbeat of a master cut off
from the controller).  RocketMQ clients keep that signature; only txbroker's own links, which
no RocketMQ client speaks, use this one.

**What is signed.**  HMAC-SHA256 keyed with the secret over :func:`content`: a domain string,
the kind (request or answer), then every field as a *named*, length-prefixed pair, in name
order, and the body, length-prefixed too.  Nothing can move between two fields, between a
field and the body, or from a request into an answer.

**Requests** (and one-way notices) carry :data:`TIMESTAMP` (ms since the epoch) and
:data:`NONCE` (16 random bytes, hex) inside the signed fields, and :data:`SIGNATURE`.  The
receiver refuses a timestamp more than :data:`MAX_CLOCK_SKEW` from its own clock, and any
nonce it has already accepted within that window (:class:`ReplayGuard`, bounded memory): a
request is obeyed at most once, and only within the window after it was made.

**Answers** carry :data:`SIGNATURE` only, computed over the answer's code, remark, fields and
body *and the nonce of the request it answers*.  A requester knows that nonce (it made it and
never reuses it), so an answer recorded for one request verifies for that request alone.
"""

from __future__ import annotations

import hashlib
import heapq
import hmac
from collections.abc import Mapping
from dataclasses import dataclass

#: ext field of a signed request: the sender's clock, milliseconds since the Unix epoch.
TIMESTAMP = "clusterTimestamp"
#: ext field of a signed request: :data:`NONCE_BYTES` random bytes in hex, never reused.
NONCE = "clusterNonce"
#: ext field of every signed command (request or answer): the HMAC in hex.
SIGNATURE = "clusterSignature"

#: Random bytes per nonce: 128 bits, so two senders never pick the same one.
NONCE_BYTES = 16
#: A request whose timestamp is further than this from the receiver's clock (either way) is
#: refused: the nodes' clocks must agree this closely (NTP keeps them within milliseconds),
#: and a request held back by someone on the path is worthless after it.  It is also how long
#: a nonce must be remembered.
MAX_CLOCK_SKEW = 10.0
#: Nonces remembered at most.  Only requests whose signature verified are remembered, so only
#: holders of the secret can fill it; a controller with 100 brokers heartbeating 4 times a
#: second within a 20 s span remembers 8,000.  When it is full of live entries a request is
#: refused rather than a live nonce forgotten (forgetting one would let its request replay).
MAX_NONCES = 65536

_DOMAIN = b"txbroker-cluster-envelope/1"
_REQUEST = b"request"
_ANSWER = b"answer"
_HEX = frozenset("0123456789abcdef")


class EnvelopeError(Exception):
    """A command that must not be obeyed or believed; the message says why (no secret in it).

    ``reason`` is a short fixed phrase per cause, for logging a cause once."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{reason}{detail}")
        self.reason = reason


def _item(out: bytearray, data: bytes) -> None:
    out += len(data).to_bytes(4, "big")
    out += data


def content(kind: bytes, head: Mapping[str, str], fields: Mapping[str, str], body: bytes) -> bytes:
    """The bytes an envelope signature covers.

    ``head`` holds what is not an ext field (the command's code, an answer's remark and the
    request's nonce), ``fields`` the ext fields (:data:`SIGNATURE` left out): each a count,
    then name and value as length-prefixed UTF-8 in name order; then the body, length-prefixed.
    Every part has its length in front, so no two different commands share these bytes."""
    out = bytearray()
    _item(out, _DOMAIN)
    _item(out, kind)
    for part in (head, {k: v for k, v in fields.items() if k != SIGNATURE}):
        out += len(part).to_bytes(4, "big")
        for name in sorted(part):
            _item(out, name.encode("utf-8", "surrogatepass"))
            _item(out, part[name].encode("utf-8", "surrogatepass"))
    _item(out, body)
    return bytes(out)


def _mac(secret: str, data: bytes) -> str:
    return hmac.new(secret.encode("utf-8"), data, hashlib.sha256).hexdigest()


def _request_head(code: int) -> dict[str, str]:
    return {"code": str(int(code))}


def _answer_head(code: int, remark: str | None, request_nonce: str) -> dict[str, str]:
    # A remark of None and an empty remark are one thing on the wire (the codec may drop it).
    return {"code": str(int(code)), "remark": remark or "", "requestNonce": request_nonce}


def sign_request(secret: str, code: int, ext: dict[str, str], body: bytes, *, now: float,
                 nonce: bytes) -> str:
    """Add :data:`TIMESTAMP`, :data:`NONCE` and :data:`SIGNATURE` to ``ext`` (in place; call
    after every other field is set); returns the nonce, which the answer must be bound to.

    ``now`` is the sender's wall clock in seconds, ``nonce`` :data:`NONCE_BYTES` fresh random
    bytes (``os.urandom``): the caller supplies both, so this stays a pure function."""
    if len(nonce) != NONCE_BYTES:
        raise ValueError(f"nonce must be {NONCE_BYTES} bytes, got {len(nonce)}")
    ext.pop(SIGNATURE, None)
    ext[TIMESTAMP] = str(int(now * 1000))
    ext[NONCE] = nonce.hex()
    ext[SIGNATURE] = _mac(secret, content(_REQUEST, _request_head(code), ext, body))
    return ext[NONCE]


@dataclass(frozen=True, slots=True)
class Stamp:
    """A verified request's timestamp (seconds) and nonce, for :meth:`ReplayGuard.admit`."""

    timestamp: float
    nonce: str


def is_signed(ext: Mapping[str, str]) -> bool:
    """Whether ``ext`` carries an envelope signature (valid or not)."""
    return SIGNATURE in ext


def verify_request(secret: str, code: int, ext: Mapping[str, str], body: bytes) -> Stamp:
    """The stamp of a request whose signature is right; raises :class:`EnvelopeError`.

    Freshness is the :class:`ReplayGuard`'s to judge, after this: a nonce is remembered only
    once its request proved to come from a holder of the secret."""
    sig = ext.get(SIGNATURE)
    if sig is None:
        raise EnvelopeError("it is not signed")
    ts, nonce = ext.get(TIMESTAMP), ext.get(NONCE)
    if ts is None or nonce is None:
        raise EnvelopeError("it is signed without a timestamp and nonce")
    expected = _mac(secret, content(_REQUEST, _request_head(code), ext, body))
    if not hmac.compare_digest(expected.encode(), sig.encode("utf-8", "surrogatepass")):
        raise EnvelopeError("its signature does not match (a different cluster_secret?)")
    # Only a holder of the secret gets here, but its fields are still checked before use.
    if not (ts.isascii() and ts.isdigit() and len(ts) <= 15):
        raise EnvelopeError("its timestamp is malformed")
    if len(nonce) != 2 * NONCE_BYTES or not set(nonce) <= _HEX:
        raise EnvelopeError("its nonce is malformed")
    return Stamp(int(ts) / 1000, nonce)


def sign_answer(secret: str, code: int, remark: str | None, ext: dict[str, str], body: bytes,
                request_nonce: str) -> None:
    """Add :data:`SIGNATURE` to an answer's ``ext`` (in place), bound to ``request_nonce``."""
    ext.pop(SIGNATURE, None)
    ext[SIGNATURE] = _mac(secret, content(_ANSWER, _answer_head(code, remark, request_nonce),
                                          ext, body))


def verify_answer(secret: str, code: int, remark: str | None, ext: Mapping[str, str],
                  body: bytes, request_nonce: str) -> None:
    """Raises :class:`EnvelopeError` unless the answer is signed for the request whose nonce
    is ``request_nonce``."""
    sig = ext.get(SIGNATURE)
    if sig is None:
        raise EnvelopeError("it is not signed")
    expected = _mac(secret, content(_ANSWER, _answer_head(code, remark, request_nonce), ext, body))
    if not hmac.compare_digest(expected.encode(), sig.encode("utf-8", "surrogatepass")):
        raise EnvelopeError("its signature does not match (a different cluster_secret, or an "
                            "answer to another request)")


class ReplayGuard:
    """A receiver's memory of the nonces it accepted, for :data:`MAX_CLOCK_SKEW` after each
    one's timestamp; one per receiving process (a controller, a name server, a broker's
    controller link, a broker's Kafka side).  Not thread-safe: one event loop.

    A nonce is kept until its timestamp has left the window, after which the timestamp alone
    refuses its request; so memory is bounded by the requests accepted within one window,
    and at most ``capacity``."""

    def __init__(self, *, max_skew: float = MAX_CLOCK_SKEW, capacity: int = MAX_NONCES) -> None:
        if max_skew <= 0 or capacity <= 0:
            raise ValueError("max_skew and capacity must be positive")
        self.max_skew = max_skew
        self.capacity = capacity
        self._seen: set[str] = set()
        #: (forget at, nonce), earliest first.
        self._expiry: list[tuple[float, str]] = []

    def __len__(self) -> int:
        return len(self._seen)

    def admit(self, stamp: Stamp, now: float) -> None:
        """Accept ``stamp`` once, or raise :class:`EnvelopeError` (stale, from the future,
        seen before, or no room left)."""
        off = stamp.timestamp - now
        if abs(off) > self.max_skew:
            raise EnvelopeError(
                "its timestamp is outside the accepted window (clocks apart, or a replay)",
                f": {off:+.1f} s from this node's clock, at most {self.max_skew:g} s allowed")
        self._forget(now)
        if stamp.nonce in self._seen:
            raise EnvelopeError("it repeats a nonce already accepted (a replay)")
        if len(self._seen) >= self.capacity:
            raise EnvelopeError("too many signed requests within the window",
                                f" (more than {self.capacity} in {2 * self.max_skew:g} s)")
        self._seen.add(stamp.nonce)
        heapq.heappush(self._expiry, (stamp.timestamp + self.max_skew, stamp.nonce))

    def _forget(self, now: float) -> None:
        expiry = self._expiry
        while expiry and expiry[0][0] < now:
            self._seen.discard(heapq.heappop(expiry)[1])
