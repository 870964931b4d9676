"""A running broker and the user store: access keys made by ``txbroker user`` sign RocketMQ
requests at once (no restart), a deleted user's key stops working, and a bad users file stops
``txbroker serve`` with one line naming it."""

from __future__ import annotations

import logging
import subprocess
import sys

from support.cli_runner import cli_ok, run_cli
from support.waiting import eventually

from txbroker.broker import Broker
from txbroker.client import Message, Producer
from txbroker.client.errors import SendError

ACL = """\
accounts:
  - accessKey: operations
    secretKey: operations-secret
    admin: true
"""


async def _send(namesrv: str, key: str, secret: str, body: bytes) -> str | None:
    """None when stored, else the broker's refusal remark."""
    async with Producer("users-test", namesrv, retries=0, access_key=key,
                        secret_key=secret) as producer:
        try:
            await producer.send(Message("Orders", body))
        except SendError as exc:
            return exc.remark
    return None


async def test_access_key_works_without_restart_and_dies_with_its_user(broker_config, tmp_path,
                                                                        caplog) -> None:
    users_file = str(tmp_path / "users.json")
    acl_file = tmp_path / "plain_acl.yml"
    acl_file.write_text(ACL)
    f = ["--users-file", users_file]
    cli_ok(await run_cli("user", "add", "alice", "--password-stdin", "--role", "producer", *f,
                         input=b"alice-password\n"))
    caplog.set_level(logging.DEBUG)
    b = Broker(broker_config.replace(acl_file=str(acl_file), users_file=users_file))
    await b.start()
    try:
        out = cli_ok(await run_cli("user", "access-key", "alice", *f))
        key = out.split("accessKey: ")[1].split()[0]
        secret = out.split("secretKey: ")[1].split()[0]
        outcomes: list[str | None] = []

        async def stored() -> bool:
            outcomes.append(await _send(b.namesrv_addr, key, secret, b"from alice"))
            return outcomes[-1] is None

        await eventually(stored, msg=lambda: f"send with the new key: {outcomes[-1:]}")
        assert b.users is not None and b.users.reloads >= 1
        refused = await _send(b.namesrv_addr, key, "not-the-secret", b"x")
        assert refused is not None and "Check signature failed" in refused

        cli_ok(await run_cli("user", "delete", "alice", *f))

        async def refused_now() -> bool:
            outcomes.append(await _send(b.namesrv_addr, key, secret, b"after delete"))
            return outcomes[-1] is not None and f"No acl config for '{key}'" in outcomes[-1]

        await eventually(refused_now, msg=lambda: f"send after delete: {outcomes[-1:]}")
        assert "alice-password" not in caplog.text and secret not in caplog.text
    finally:
        await b.stop()


def test_serve_with_a_bad_users_file_is_one_line(tmp_path) -> None:
    bad = tmp_path / "users.json"
    bad.write_text('{"version": 1, "users": {"alice": {"roles": ["root"]}}}')
    # A process of its own with a time limit: a broker that started regardless fails the test
    # instead of serving on.
    done = subprocess.run(
        [sys.executable, "-m", "txbroker", "serve", "--data-dir", str(tmp_path / "d"),
         "--listen-host", "127.0.0.1", "--broker-port", "0", "--namesrv-port", "0",
         "--metrics-port", "-1", "--users-file", str(bad)],
        capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 2, (done.stdout, done.stderr)
    lines = done.stderr.strip().splitlines()
    expected = (f"error: users file {bad}: user 'alice': unknown role(s) root "
                "(known: admin, producer, consumer)")
    assert lines == [expected], done.stderr
