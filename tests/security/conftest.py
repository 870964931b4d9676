"""Certificates for the TLS tests, made by ``trustme`` in the test's temp dir, and brokers
that serve them on 127.0.0.1 port 0."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest
import trustme

from txbroker.broker import Broker


@dataclass
class Pki:
    """One CA and a server certificate for 127.0.0.1, as PEM files."""

    ca: trustme.CA
    dir: Path
    ca_file: Path
    cert_file: Path
    key_file: Path

    def issue_server(self, cert_file: Path, key_file: Path, ca: trustme.CA | None = None,
                     **kwargs: object) -> trustme.LeafCert:
        """A server certificate for 127.0.0.1 written to the two files (``kwargs`` go to
        ``trustme.CA.issue_cert``: ``not_after`` for an expired one)."""
        leaf = (ca or self.ca).issue_cert("127.0.0.1", "localhost", **kwargs)
        leaf.cert_chain_pems[0].write_to_path(str(cert_file))
        leaf.private_key_pem.write_to_path(str(key_file))
        return leaf

    def issue_client(self, name: str) -> tuple[str, str]:
        """A client certificate signed by the CA: (cert file, key file)."""
        leaf = self.ca.issue_cert(f"{name}@clients.example")
        cert, key = self.dir / f"{name}.pem", self.dir / f"{name}.key"
        leaf.cert_chain_pems[0].write_to_path(str(cert))
        leaf.private_key_pem.write_to_path(str(key))
        return str(cert), str(key)


@pytest.fixture
def pki(tmp_path: Path) -> Pki:
    ca = trustme.CA()
    d = tmp_path / "pki"
    d.mkdir()
    pki = Pki(ca, d, d / "ca.pem", d / "server.pem", d / "server.key")
    ca.cert_pem.write_to_path(str(pki.ca_file))
    pki.issue_server(pki.cert_file, pki.key_file)
    return pki


@pytest.fixture
async def tls_broker(broker_config, pki: Pki):
    """A factory: ``await tls_broker(tls_mode="enforcing", ...)`` starts a broker serving the
    fixture's certificate; every broker is stopped after the test."""
    started: list[Broker] = []

    async def start(**changes: object) -> Broker:
        settings = {"tls_mode": "enforcing", "tls_cert": str(pki.cert_file),
                    "tls_key": str(pki.key_file), **changes}
        b = Broker(broker_config.replace(**settings))
        await b.start()
        started.append(b)
        return b

    yield start
    for b in started:
        await b.stop()
