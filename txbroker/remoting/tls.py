"""TLS for txbroker's listeners and clients: SSL contexts from one config, no I/O of its own.

Every listener that offers TLS (RocketMQ remoting, name servers, the controller, HA, metrics;
:mod:`txbroker.remoting.tls_listener` accepts for them) builds its context here, so certificate checks, the client-certificate rule and reloading are
the same everywhere.  Python's :mod:`ssl` does the cryptography; this module only decides.

* **Modes, as RocketMQ has them** (``TlsMode``): ``off`` (plaintext only, the default, so the
  quick start stays plaintext), ``permissive`` (plaintext and TLS on one port: a client is
  told apart by its first byte, :func:`starts_tls`, which RocketMQ clients rely on while a
  cluster migrates), ``enforcing`` (plaintext connections are closed).
* **Client certificates** (``tls_client_auth``): ``none``, ``optional`` (verified against
  ``tls_ca`` when sent), ``required`` (mTLS: a client without one fails the handshake).
* **Reload without a restart**: :meth:`ServerTLS.context` compares the certificate, key and
  CA files' identity (inode, size, mtime) with what it loaded, per new connection, and builds
  a new context when one changed; connections already open keep theirs.  A replacement that
  does not load (a half-written file) keeps the old context and is logged once per change.
* **Errors name the file**: a certificate or key that cannot be loaded at start is one
  :class:`TLSConfigError` saying which file and why.
* **Clients verify the server by default** (:class:`ClientTLS`): the CA file given, else the
  system store, and the host name; ``insecure`` turns both off, for tests and development only.
* **Nodes dial nodes the same way** (:class:`PeerTLS`, ``tls_peers``): verified against the
  cluster's CA, presenting the node's own certificate, reloaded in place when it changes.
"""

from __future__ import annotations

import logging
import os
import ssl
from dataclasses import dataclass
from typing import Protocol

from txbroker.config import BrokerConfig, ConfigError, TlsClientAuth, TlsMode

log = logging.getLogger("txbroker.remoting.tls")

#: The first byte of every TLS record carrying a handshake (RFC 8446 §5.1, ContentType 22):
#: a ClientHello starts with it.  A RocketMQ frame starts with its 4-byte big-endian length,
#: whose first byte is 0 for any frame below 16 MiB, so the two never meet.
TLS_HANDSHAKE_BYTE = 0x16
#: How long an accepted connection may stay silent before its first byte decides plaintext or
#: TLS (seconds); past it the connection is closed, so silent sockets cannot pile up.
FIRST_BYTE_TIMEOUT = 10.0
#: How long the TLS handshake itself may take (seconds).
HANDSHAKE_TIMEOUT = 10.0
#: A refused plaintext peer is logged at most once per this many seconds per peer host.
REFUSAL_LOG_INTERVAL = 60.0
#: Peers remembered for that rate limit; beyond it the oldest are forgotten.
REFUSAL_LOG_PEERS = 1024

_CLIENT_AUTH = {"none": ssl.CERT_NONE, "optional": ssl.CERT_OPTIONAL, "required": ssl.CERT_REQUIRED}


class TLSConfigError(ConfigError):
    """A certificate, key or CA file that cannot be used; the message names the file."""


def starts_tls(first: bytes) -> bool:
    """Whether a connection whose first byte(s) are ``first`` is opening a TLS session."""
    return bool(first) and first[0] == TLS_HANDSHAKE_BYTE


class RefusalLog:
    """Decides whether a refusal of ``peer`` is logged now: once per ``interval`` per peer, so
    a client retrying in a loop cannot flood the log.  Pure; the caller passes the time."""

    def __init__(self, interval: float = REFUSAL_LOG_INTERVAL,
                 max_peers: int = REFUSAL_LOG_PEERS) -> None:
        self.interval = interval
        self.max_peers = max_peers
        self._last: dict[str, float] = {}

    def should_log(self, peer: str, now: float) -> bool:
        last = self._last.get(peer)
        if last is not None and now - last < self.interval:
            return False
        self._last.pop(peer, None)
        self._last[peer] = now  # dicts keep insertion order: the first key is the oldest
        while len(self._last) > self.max_peers:
            del self._last[next(iter(self._last))]
        return True


def _file_identity(path: str | None) -> tuple[int, int, int] | None:
    if path is None:
        return None
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_ino, st.st_size, st.st_mtime_ns)


class ServerTLS:
    """A listener's TLS: its mode and a server context reloaded when its files change.

    Event-loop only (it is asked per accepted connection; the stat calls are cheap)."""

    def __init__(self, mode: TlsMode, cert: str, key: str, ca: str | None = None,
                 client_auth: TlsClientAuth = "none") -> None:
        if mode not in ("permissive", "enforcing"):
            raise TLSConfigError(f"tls_mode={mode!r}: a TLS listener is permissive or enforcing")
        self.mode = mode
        self.cert, self.key, self.ca = cert, key, ca
        self.client_auth = client_auth
        self._identity = self._files()
        self._context = self._load()  # raises TLSConfigError: a bad file stops the start
        self._failed_identity: tuple | None = None
        self.reloads = 0

    @property
    def enforcing(self) -> bool:
        return self.mode == "enforcing"

    def _files(self) -> tuple:
        return (_file_identity(self.cert), _file_identity(self.key), _file_identity(self.ca))

    def _load(self) -> ssl.SSLContext:
        ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        for path, what in ((self.cert, "certificate"), (self.key, "key")):
            if not os.path.isfile(path):
                raise TLSConfigError(f"TLS {what} file {path}: not found (or not a file)")
        try:
            ctx.load_cert_chain(self.cert, self.key)
        except (ssl.SSLError, OSError) as exc:
            raise TLSConfigError(f"TLS certificate {self.cert} with key {self.key}: cannot be "
                                 f"loaded ({_reason(exc)}); both must be PEM and match") from None
        if self.client_auth != "none":
            if self.ca is None:
                raise TLSConfigError(f"tls_client_auth={self.client_auth}: needs tls_ca, the CA "
                                     f"file client certificates are verified against")
            try:
                ctx.load_verify_locations(cafile=self.ca)
            except (ssl.SSLError, OSError) as exc:
                raise TLSConfigError(f"TLS CA file {self.ca}: cannot be loaded "
                                     f"({_reason(exc)})") from None
        ctx.verify_mode = _CLIENT_AUTH[self.client_auth]
        return ctx

    def context(self) -> ssl.SSLContext:
        """The context for the next connection: reloaded first when a file changed since."""
        files = self._files()
        if files != self._identity and files != self._failed_identity:
            try:
                self._context = self._load()
            except TLSConfigError as exc:
                self._failed_identity = files  # logged once per change, not per connection
                log.error("TLS files changed but cannot be used, keeping the previous "
                          "certificate: %s", exc)
            else:
                self._identity = files
                self._failed_identity = None
                self.reloads += 1
                log.info("TLS certificate %s reloaded", self.cert)
        return self._context


def _reason(exc: BaseException) -> str:
    if isinstance(exc, ssl.SSLError) and exc.reason:
        return exc.reason.replace("_", " ").lower()
    return getattr(exc, "strerror", None) or str(exc)


class TlsConfig(Protocol):
    """The ``tls_*`` settings a listener reads: ``BrokerConfig``, ``ControllerConfig`` and the
    name server's ``TlsSettings`` all have them."""

    @property
    def tls_mode(self) -> TlsMode: ...
    @property
    def tls_cert(self) -> str | None: ...
    @property
    def tls_key(self) -> str | None: ...
    @property
    def tls_ca(self) -> str | None: ...
    @property
    def tls_client_auth(self) -> TlsClientAuth: ...


def server_tls(config: TlsConfig) -> ServerTLS | None:
    """A process's listeners' TLS from ``config`` (None with ``tls_mode=off``): one object per
    process, shared by its ports, so a renewed certificate reaches all of them."""
    if config.tls_mode == "off":
        return None
    assert config.tls_cert and config.tls_key  # check_tls (the config's own check) says so
    return ServerTLS(config.tls_mode, config.tls_cert, config.tls_key, config.tls_ca,
                     config.tls_client_auth)


@dataclass(frozen=True)
class ClientTLS:
    """How a client speaks TLS: trust ``ca`` (else the system store), verify the host name,
    optionally present ``cert``/``key`` (for a listener with ``tls_client_auth``).
    ``insecure`` verifies nothing: tests and development only."""

    ca: str | None = None
    insecure: bool = False
    cert: str | None = None
    key: str | None = None

    def context(self) -> ssl.SSLContext:
        """A new client context; a file that cannot be loaded is a :class:`TLSConfigError`."""
        ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        if self.insecure:
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
        elif self.ca is not None:
            try:
                ctx.load_verify_locations(cafile=self.ca)
            except (ssl.SSLError, OSError) as exc:
                raise TLSConfigError(f"TLS CA file {self.ca}: cannot be loaded "
                                     f"({_reason(exc)})") from None
        if (self.cert is None) != (self.key is None):
            raise TLSConfigError("a client certificate needs its key, and a key its certificate")
        if self.cert is not None:
            try:
                ctx.load_cert_chain(self.cert, self.key)
            except (ssl.SSLError, OSError) as exc:
                raise TLSConfigError(f"TLS client certificate {self.cert} with key {self.key}: "
                                     f"cannot be loaded ({_reason(exc)})") from None
        return ctx


def dials_peers_with_tls(config: BrokerConfig) -> bool:
    """``tls_peers`` worked out: ``on``, or ``auto`` with ``tls_mode=enforcing``."""
    return config.tls_peers == "on" or (config.tls_peers == "auto"
                                        and config.tls_mode == "enforcing")


class PeerTLS:
    """How a node dials its peers (name servers, the controller, its group's master): one
    client context shared by every link, verifying the peer against ``ca`` (else the system
    store) and the host name or IP address dialled, and presenting ``cert``/``key`` as the
    node's client certificate, so peers with ``tls_client_auth=required`` accept it (mTLS
    between nodes).

    :meth:`refresh` (the broker's housekeeping calls it every second) loads the files again
    into that same context when their inode, size or mtime changed, so a renewed node
    certificate goes out on the next connection of every link without a restart; connections
    open keep their session.  A replacement is first loaded into a context of its own, so one
    that cannot be used (a half-written file, a key that does not match) leaves the shared
    context as it was, logged once per change.  A CA file's new certificates are added to
    those trusted; one removed from it stays trusted until a restart.  Event-loop only."""

    def __init__(self, ca: str | None, cert: str | None, key: str | None) -> None:
        self._tls = ClientTLS(ca=ca, cert=cert, key=key)
        self.context = self._tls.context()  # raises TLSConfigError: a bad file stops the start
        self._identity = self._files()
        self._failed_identity: tuple | None = None
        self.reloads = 0

    def _files(self) -> tuple:
        return tuple(_file_identity(p) for p in (self._tls.cert, self._tls.key, self._tls.ca))

    def refresh(self) -> bool:
        """Load changed files into the shared context; True when it did."""
        files = self._files()
        if files == self._identity or files == self._failed_identity:
            return False
        try:
            self._tls.context()  # the whole set must load before the shared context changes
        except TLSConfigError as exc:
            self._failed_identity = files
            log.error("TLS files for dialling peers changed but cannot be used, keeping the "
                      "previous certificate: %s", exc)
            return False
        if self._tls.cert is not None:
            self.context.load_cert_chain(self._tls.cert, self._tls.key)
        if self._tls.ca is not None:
            self.context.load_verify_locations(cafile=self._tls.ca)
        self._identity = files
        self._failed_identity = None
        self.reloads += 1
        log.info("TLS certificate %s reloaded for dialling peers", self._tls.cert)
        return True


def peer_tls(config: BrokerConfig) -> PeerTLS | None:
    """This broker's :class:`PeerTLS` from ``tls_ca``/``tls_cert``/``tls_key``: None
    (plaintext) unless ``tls_peers`` is ``on``, or ``auto`` with ``tls_mode=enforcing``.  A
    file that cannot be loaded is a :class:`TLSConfigError` (at start)."""
    if not dials_peers_with_tls(config):
        return None
    return PeerTLS(config.tls_ca, config.tls_cert, config.tls_key)


def link_failure(exc: BaseException) -> str:
    """Why a link to a peer failed, in a few words for its one log line: a certificate the
    peer presented that does not verify says so and why ("certificate verify failed:
    self-signed certificate in certificate chain")."""
    if isinstance(exc, ssl.SSLCertVerificationError):
        return f"certificate verify failed: {exc.verify_message}"
    cause = exc.__cause__ or exc.__context__
    if isinstance(cause, ssl.SSLCertVerificationError):
        return f"certificate verify failed: {cause.verify_message}"
    return str(exc) or type(exc).__name__


def client_context(tls: ClientTLS | ssl.SSLContext | None) -> ssl.SSLContext | None:
    """The SDK's ``tls=`` argument as a context (None: plaintext)."""
    if tls is None or isinstance(tls, ssl.SSLContext):
        return tls
    return tls.context()
