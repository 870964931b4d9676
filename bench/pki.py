"""A throwaway CA and server certificate for benchmarks that run the broker with TLS.

A TLS benchmark must not depend on certificates someone has lying around, nor leave any
behind: :class:`ThrowawayPki` makes a CA and a certificate for 127.0.0.1 and ``localhost``
with ``trustme`` (the ``bench`` extra) in a temporary directory that goes with it.  The
broker serves ``cert``/``key``; clients trust ``ca`` and verify the host name, as a real
deployment does, so the handshake measured is the one users get.
"""

from __future__ import annotations

import ssl
import tempfile
from pathlib import Path
from typing import Self

from txbroker.bench.extras import require
from txbroker.remoting.tls import ClientTLS


class ThrowawayPki:
    """PEM files of one CA and one server certificate, removed on exit."""

    def __init__(self) -> None:
        require("trustme")
        self._dir = tempfile.TemporaryDirectory(prefix="txbroker-bench-pki-")
        root = Path(self._dir.name)
        self.ca, self.cert, self.key = root / "ca.pem", root / "server.pem", root / "server.key"

    def __enter__(self) -> Self:
        import trustme

        ca = trustme.CA()
        leaf = ca.issue_cert("127.0.0.1", "localhost")
        ca.cert_pem.write_to_path(str(self.ca))
        leaf.cert_chain_pems[0].write_to_path(str(self.cert))
        leaf.private_key_pem.write_to_path(str(self.key))
        return self

    def __exit__(self, *exc: object) -> None:
        self._dir.cleanup()

    def client_tls(self) -> ClientTLS:
        """What the SDK is given: trust this CA, verify the host name."""
        return ClientTLS(ca=str(self.ca))

    def client_context(self) -> ssl.SSLContext:
        """The same as a context, for raw RemotingClient connections."""
        return self.client_tls().context()

    def serve_args(self) -> list[str]:
        """``txbroker serve`` options for a broker that accepts TLS only."""
        return ["--tls-mode", "enforcing", "--tls-cert", str(self.cert), "--tls-key", str(self.key)]
