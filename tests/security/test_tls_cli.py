"""TLS through the command line: ``txbroker serve`` with the tls_* settings (a real process),
and the client commands' ``--tls``, ``--tls-ca``, ``--tls-insecure``."""

from __future__ import annotations

import subprocess
import sys

import pytest
from support.cli_runner import cli_ok, cli_one_line_error, run_cli

from txbroker.client import Message, Producer
from txbroker.remoting.tls import ClientTLS


async def test_cli_produces_and_consumes_over_tls(tls_broker, pki) -> None:
    b = await tls_broker(tls_mode="enforcing")
    ns = ("--namesrv", b.namesrv_addr)
    cli_ok(await run_cli("produce", "--topic", "TCliTls", "--body", "one", "--tls-ca",
                         str(pki.ca_file), *ns))
    cli_ok(await run_cli("produce", "--topic", "TCliTls", "--body", "two", *ns,
                         env={"TXBROKER_TLS": "1", "TXBROKER_TLS_CA": str(pki.ca_file)}))
    out = cli_ok(await run_cli("consume", "--topic", "TCliTls", "--group", "CG_CLI_TLS",
                               "--from-beginning", "--max", "2", "--timeout", "10",
                               "--tls-insecure", *ns))
    assert "one" in out and "two" in out


async def test_cli_errors_are_one_line(tls_broker, pki, tmp_path) -> None:
    b = await tls_broker(tls_mode="enforcing")
    ns = ("--namesrv", b.namesrv_addr)
    plain = cli_one_line_error(await run_cli("topic", "list", *ns))
    assert b.namesrv_addr in plain and "requires TLS" in plain
    untrusted = cli_one_line_error(await run_cli("topic", "list", "--tls", *ns))
    assert b.namesrv_addr in untrusted and "certificate verify failed" in untrusted
    missing = tmp_path / "no-ca.pem"
    bad_ca = cli_one_line_error(await run_cli("topic", "list", "--tls-ca", str(missing), *ns))
    assert f"TLS CA file {missing}" in bad_ca
    assert "TTls" not in b.store.queues()


async def test_cli_presents_a_client_certificate(tls_broker, pki) -> None:
    b = await tls_broker(tls_client_auth="required", tls_ca=str(pki.ca_file))
    ns = ("--namesrv", b.namesrv_addr, "--tls-ca", str(pki.ca_file))
    refused = cli_one_line_error(await run_cli("produce", "--topic", "TCliMtls", "--body", "x", *ns))
    assert b.namesrv_addr in refused
    cert, key = pki.issue_client("cli")
    cli_ok(await run_cli("produce", "--topic", "TCliMtls", "--body", "x", *ns,
                         "--tls-client-cert", cert, "--tls-client-key", key))
    assert "TCliMtls" in b.store.queues()


def _serve(tmp_path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-P", "-m", "txbroker", "serve", "--data-dir", str(tmp_path / "data"),
         "--listen-host", "127.0.0.1", "--broker-port", "0", "--namesrv-port", "-1",
         "--metrics-port", "-1", *args],
        capture_output=True, text=True, timeout=60, check=False)


@pytest.mark.parametrize("which", ["key path", "mismatched key", "CA path"])
def test_serve_with_a_bad_key_is_one_error_line(tmp_path, pki, which) -> None:
    extra: tuple[str, ...] = ()
    if which == "CA path":
        key, ca = pki.key_file, tmp_path / "missing-ca.pem"
        extra = ("--tls-client-auth", "required", "--tls-ca", str(ca))
        expected = f"error: TLS CA file {ca}: cannot be loaded"
    elif which == "key path":
        key = tmp_path / "missing.key"
        expected = f"error: TLS key file {key}: not found"
    else:
        key = tmp_path / "other.key"
        pki.issue_server(tmp_path / "other.pem", key)
        expected = f"error: TLS certificate {pki.cert_file} with key {key}: cannot be loaded"
    run = _serve(tmp_path, "--tls-mode", "enforcing", "--tls-cert", str(pki.cert_file),
                 "--tls-key", str(key), *extra)
    assert run.returncode == 2, run.stderr
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(expected), run.stderr
    assert "Traceback" not in run.stderr


@pytest.mark.slow
async def test_serve_process_speaks_tls(broker_process, pki) -> None:
    """The served process (its own event loop, uvloop when installed) over TLS and plaintext."""
    proc = broker_process(tls_mode="permissive", tls_cert=str(pki.cert_file),
                          tls_key=str(pki.key_file))
    for body, tls in ((b"secure", ClientTLS(ca=str(pki.ca_file))), (b"plain", None)):
        async with Producer("PG_PROC", proc.namesrv_addr, tls=tls) as producer:
            result = await producer.send(Message("TProc", body))
        assert result.queue_offset >= 0
    assert "tls              permissive" in proc.log_tail()
