"""Both locks at once on the RocketMQ port: mTLS (no certificate of the CA, no connection) and
the plain ACL fed by the user store (a request signed with a user's access key, allowed by its
role).  The SDK and the CLI over TLS with an access key; each refusal stores nothing."""

from __future__ import annotations

from support.cli_runner import cli_ok, cli_one_line_error, run_cli

from txbroker.client import Message, Producer
from txbroker.client.errors import SendError
from txbroker.remoting.tls import ClientTLS

#: The ACL file only turns access control on: the accounts are the users file's.
ACL = "accounts: []\n"


async def _user_key(users_file: str, name: str, role: str) -> tuple[str, str]:
    f = ("--users-file", users_file)
    cli_ok(await run_cli("user", "add", name, "--password-stdin", "--role", role, *f,
                         input=f"{name}-password\n".encode()))
    out = cli_ok(await run_cli("user", "access-key", name, *f))
    return out.split("accessKey: ")[1].split()[0], out.split("secretKey: ")[1].split()[0]


async def test_sdk_and_cli_over_mtls_with_access_keys(tls_broker, pki, tmp_path) -> None:
    users_file = str(tmp_path / "users.json")
    acl_file = tmp_path / "plain_acl.yml"
    acl_file.write_text(ACL)
    writer = await _user_key(users_file, "writer", "producer")
    reader = await _user_key(users_file, "reader", "consumer")
    b = await tls_broker(tls_client_auth="required", tls_ca=str(pki.ca_file),
                         acl_file=str(acl_file), users_file=users_file)
    cert, key = pki.issue_client("app")
    tls = ClientTLS(ca=str(pki.ca_file), cert=cert, key=key)

    async with Producer("tls-acl", b.namesrv_addr, retries=0, tls=tls, access_key=writer[0],
                        secret_key=writer[1]) as producer:
        await producer.send(Message("TlsAcl", b"sdk"))
    async with Producer("tls-acl", b.namesrv_addr, retries=0, tls=tls, access_key=reader[0],
                        secret_key=reader[1]) as producer:
        try:
            await producer.send(Message("TlsAcl", b"not a producer"))
        except SendError as exc:
            assert "AclException" in (exc.remark or ""), exc.remark
        else:
            raise AssertionError("a consumer's key published")

    tls_args = ("--namesrv", b.namesrv_addr, "--tls-ca", str(pki.ca_file),
                "--tls-client-cert", cert, "--tls-client-key", key)
    cli_ok(await run_cli("produce", "--topic", "TlsAcl", "--body", "cli", *tls_args,
                         "--access-key", writer[0], "--secret-key", writer[1]))
    unsigned = cli_one_line_error(await run_cli("produce", "--topic", "TlsAcl", "--body", "x",
                                                *tls_args))
    assert "AccessKey" in unsigned or "access key" in unsigned.lower(), unsigned
    no_cert = cli_one_line_error(await run_cli(
        "produce", "--topic", "TlsAcl", "--body", "x", "--namesrv", b.namesrv_addr,
        "--tls-ca", str(pki.ca_file), "--access-key", writer[0], "--secret-key", writer[1]))
    assert b.namesrv_addr in no_cert, no_cert
    out = cli_ok(await run_cli("consume", "--topic", "TlsAcl", "--group", "tls-acl-readers",
                               "--from-beginning", "--max", "2", "--timeout", "10", *tls_args,
                               "--access-key", reader[0], "--secret-key", reader[1]))
    assert "sdk" in out and "cli" in out
    # what was refused left nothing: the topic holds the two sends that were allowed
    assert sum(b.store.max_offset("TlsAcl", q) for q in b.store.queues()["TlsAcl"]) == 2
