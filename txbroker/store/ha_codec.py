"""The HA stream's four messages (RocketMQ 5.x AutoSwitch HA, docs/cluster.md "Replication
(HA)"): pure bytes in, typed values out, no I/O.

Both directions start every message with an int32 state (HANDSHAKE 1, TRANSFER 2, the ordinals
of RocketMQ's ``HAConnectionState``), so a decoder knows the layout from the first four bytes
and the direction it reads:

* slave -> master: a 16-byte handshake, then 12-byte acks;
* master -> slave: a handshake carrying the master's epoch entries, then transfer headers
  (36 bytes) each followed by raw commitlog bytes.

**Authentication (txbroker's extension).**  With a cluster secret set on both ends, three
messages come before the handshakes, each with a state no RocketMQ peer sends:

* slave -> master ``AuthHello`` (20 bytes): state, a 16-byte random nonce;
* master -> slave ``AuthChallenge`` (52 bytes): state, the master's nonce, and its proof
  ``HMAC-SHA256(secret, "txbroker-ha master" + slave nonce + master nonce)``;
* slave -> master ``AuthProof`` (44 bytes): state, slave id, and its proof
  ``HMAC-SHA256(secret, "txbroker-ha slave" + master nonce + slave nonce + slave id)``;
  the slave's handshake follows and must carry the same id.

Each side proves itself over the other's fresh nonce, so a recorded exchange is worth
nothing, and the two proofs are labelled apart so one can never stand in for the other.
Without a secret nothing of this is sent: the stream is RocketMQ's, byte for byte.

The decoders are incremental: :meth:`feed` bytes as they arrive, then :meth:`next` returns one
message or None (need more).  Anything that cannot be a message (an unknown state, a negative
or oversized body size, an epoch body that is not whole entries) raises :class:`ProtocolError`;
a peer that sends it is dropped.
"""

from __future__ import annotations

import hashlib
import hmac
import struct
from dataclasses import dataclass, field

STATE_HANDSHAKE = 1
STATE_TRANSFER = 2
#: The authentication messages' states: far from RocketMQ's ``HAConnectionState`` ordinals
#: (0-4), so a RocketMQ peer reads them as garbage rather than as one of its own messages.
STATE_AUTH_HELLO = 0x74784101
STATE_AUTH_CHALLENGE = 0x74784102
STATE_AUTH_PROOF = 0x74784103
NONCE_SIZE = 16
PROOF_SIZE = 32  # HMAC-SHA256

#: A transfer body is at most this big unless the decoder is told otherwise (the master sends
#: ~1 MiB batches; a larger size is garbage, not a message to buffer).
MAX_BODY = 8 * 1024 * 1024
#: Epoch entries a master handshake may carry.
MAX_EPOCH_ENTRIES = 65536

_STATE = struct.Struct(">i")
_SLAVE_HANDSHAKE = struct.Struct(">ihhq")  # state, isSyncFromLastFile, isAsyncLearner, slaveBrokerId
_MASTER_HANDSHAKE = struct.Struct(">iiqi")  # state, bodySize, master max offset, last epoch
_EPOCH_ENTRY = struct.Struct(">iq")  # epoch, startOffset
_ACK = struct.Struct(">iq")  # state, slave max offset
_TRANSFER = struct.Struct(">iiqiqq")  # state, bodySize, offset, epoch, epochStartOffset, confirmOffset
TRANSFER_HEADER_SIZE = _TRANSFER.size  # 36
_AUTH_HELLO = struct.Struct(f">i{NONCE_SIZE}s")
_AUTH_CHALLENGE = struct.Struct(f">i{NONCE_SIZE}s{PROOF_SIZE}s")
_AUTH_PROOF = struct.Struct(f">iq{PROOF_SIZE}s")


class ProtocolError(Exception):
    """Bytes that are not an HA message."""


@dataclass(frozen=True, slots=True)
class SlaveHandshake:
    slave_id: int
    sync_from_last_file: bool = False
    async_learner: bool = False


@dataclass(frozen=True, slots=True)
class MasterHandshake:
    max_offset: int
    last_epoch: int
    #: (epoch, start offset), oldest first.
    epochs: list[tuple[int, int]] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class SlaveAck:
    max_offset: int


@dataclass(frozen=True, slots=True)
class Transfer:
    offset: int
    epoch: int
    epoch_start: int
    confirm_offset: int
    body: bytes = b""


@dataclass(frozen=True, slots=True)
class AuthHello:
    nonce: bytes


@dataclass(frozen=True, slots=True)
class AuthChallenge:
    nonce: bytes
    proof: bytes


@dataclass(frozen=True, slots=True)
class AuthProof:
    slave_id: int
    proof: bytes


def master_proof(secret: bytes, slave_nonce: bytes, master_nonce: bytes) -> bytes:
    return hmac.new(secret, b"txbroker-ha master" + slave_nonce + master_nonce, hashlib.sha256).digest()


def slave_proof(secret: bytes, master_nonce: bytes, slave_nonce: bytes, slave_id: int) -> bytes:
    msg = b"txbroker-ha slave" + master_nonce + slave_nonce + struct.pack(">q", slave_id)
    return hmac.new(secret, msg, hashlib.sha256).digest()


def proof_matches(expected: bytes, got: bytes) -> bool:
    """Constant-time comparison (a proof must not leak how much of it was right)."""
    return hmac.compare_digest(expected, got)


def encode_auth_hello(m: AuthHello) -> bytes:
    return _AUTH_HELLO.pack(STATE_AUTH_HELLO, m.nonce)


def encode_auth_challenge(m: AuthChallenge) -> bytes:
    return _AUTH_CHALLENGE.pack(STATE_AUTH_CHALLENGE, m.nonce, m.proof)


def encode_auth_proof(m: AuthProof) -> bytes:
    return _AUTH_PROOF.pack(STATE_AUTH_PROOF, m.slave_id, m.proof)


def encode_slave_handshake(m: SlaveHandshake) -> bytes:
    return _SLAVE_HANDSHAKE.pack(STATE_HANDSHAKE, int(m.sync_from_last_file), int(m.async_learner), m.slave_id)


def encode_master_handshake(m: MasterHandshake) -> bytes:
    body = b"".join(_EPOCH_ENTRY.pack(e, s) for e, s in m.epochs)
    return _MASTER_HANDSHAKE.pack(STATE_HANDSHAKE, len(body), m.max_offset, m.last_epoch) + body


def encode_ack(max_offset: int) -> bytes:
    return _ACK.pack(STATE_TRANSFER, max_offset)


def encode_transfer_header(offset: int, size: int, epoch: int, epoch_start: int, confirm: int) -> bytes:
    """The 36-byte header; the caller sends the ``size`` body bytes after it (no copy here)."""
    return _TRANSFER.pack(STATE_TRANSFER, size, offset, epoch, epoch_start, confirm)


def encode_transfer(m: Transfer) -> bytes:
    return encode_transfer_header(m.offset, len(m.body), m.epoch, m.epoch_start, m.confirm_offset) + m.body


class _Decoder:
    def __init__(self) -> None:
        self._buf = bytearray()

    def feed(self, data: bytes) -> None:
        self._buf += data

    def _state(self) -> int | None:
        if len(self._buf) < 4:
            return None
        return _STATE.unpack_from(self._buf, 0)[0]

    def _take(self, n: int) -> bytes:
        out = bytes(self._buf[:n])
        del self._buf[:n]
        return out


class SlaveStreamDecoder(_Decoder):
    """What a master reads: (with a secret: a hello and a proof), one handshake, then acks."""

    def next(self) -> SlaveHandshake | SlaveAck | AuthHello | AuthProof | None:
        state = self._state()
        if state is None:
            return None
        if state == STATE_AUTH_HELLO:
            if len(self._buf) < _AUTH_HELLO.size:
                return None
            return AuthHello(_AUTH_HELLO.unpack(self._take(_AUTH_HELLO.size))[1])
        if state == STATE_AUTH_PROOF:
            if len(self._buf) < _AUTH_PROOF.size:
                return None
            _, slave_id, proof = _AUTH_PROOF.unpack(self._take(_AUTH_PROOF.size))
            return AuthProof(slave_id, proof)
        if state == STATE_HANDSHAKE:
            if len(self._buf) < _SLAVE_HANDSHAKE.size:
                return None
            _, last_file, learner, slave_id = _SLAVE_HANDSHAKE.unpack(self._take(_SLAVE_HANDSHAKE.size))
            if last_file not in (0, 1) or learner not in (0, 1):
                raise ProtocolError(f"slave handshake flags must be 0 or 1, got {last_file} and {learner}")
            return SlaveHandshake(slave_id, bool(last_file), bool(learner))
        if state == STATE_TRANSFER:
            if len(self._buf) < _ACK.size:
                return None
            offset = _ACK.unpack(self._take(_ACK.size))[1]
            if offset < 0:
                raise ProtocolError(f"slave ack offset {offset} is negative")
            return SlaveAck(offset)
        raise ProtocolError(f"unknown HA state {state} from a slave")


class MasterStreamDecoder(_Decoder):
    """What a slave reads: (with a secret: a challenge), one handshake, then transfer headers
    with their bodies."""

    def __init__(self, max_body: int = MAX_BODY) -> None:
        super().__init__()
        self.max_body = max_body

    def next(self) -> MasterHandshake | Transfer | AuthChallenge | None:
        state = self._state()
        if state is None:
            return None
        if state == STATE_AUTH_CHALLENGE:
            if len(self._buf) < _AUTH_CHALLENGE.size:
                return None
            _, nonce, proof = _AUTH_CHALLENGE.unpack(self._take(_AUTH_CHALLENGE.size))
            return AuthChallenge(nonce, proof)
        if state == STATE_HANDSHAKE:
            if len(self._buf) < _MASTER_HANDSHAKE.size:
                return None
            _, size, max_offset, last_epoch = _MASTER_HANDSHAKE.unpack_from(self._buf, 0)
            if size < 0 or size % _EPOCH_ENTRY.size or size > MAX_EPOCH_ENTRIES * _EPOCH_ENTRY.size:
                raise ProtocolError(f"master handshake body of {size} bytes is not whole epoch entries")
            if len(self._buf) < _MASTER_HANDSHAKE.size + size:
                return None
            raw = self._take(_MASTER_HANDSHAKE.size + size)
            epochs = list(_EPOCH_ENTRY.iter_unpack(raw[_MASTER_HANDSHAKE.size:]))
            return MasterHandshake(max_offset, last_epoch, epochs)
        if state == STATE_TRANSFER:
            if len(self._buf) < TRANSFER_HEADER_SIZE:
                return None
            _, size, offset, epoch, epoch_start, confirm = _TRANSFER.unpack_from(self._buf, 0)
            if not 0 <= size <= self.max_body:
                raise ProtocolError(f"transfer body size {size} outside 0..{self.max_body}")
            if offset < 0:
                raise ProtocolError(f"transfer offset {offset} is negative")
            if len(self._buf) < TRANSFER_HEADER_SIZE + size:
                return None
            raw = self._take(TRANSFER_HEADER_SIZE + size)
            return Transfer(offset, epoch, epoch_start, confirm, raw[TRANSFER_HEADER_SIZE:])
        raise ProtocolError(f"unknown HA state {state} from a master")
