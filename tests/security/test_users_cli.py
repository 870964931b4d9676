"""``txbroker user ...`` through the real CLI: what it writes, what it prints, what it refuses."""

from __future__ import annotations

import os
import stat
import subprocess
import sys

import orjson
from click.testing import CliRunner
from support.cli_runner import cli_ok, cli_one_line_error
from support.clock import ManualClock
from support.scram_client import client_proof

from txbroker.cli.main import main
from txbroker.service.scram import verify_client_proof
from txbroker.service.users import UserStore, load_users

PASSWORD = "Tr0ub4dor&3-not-in-any-file"
NEW_PASSWORD = "another-Secret-42"


def _run(*args: str, input: str | None = None, env: dict[str, str] | None = None):
    return CliRunner().invoke(main, ["user", *args], input=input, env=env, catch_exceptions=False)



def _logs_in(path, name: str, password: str) -> bool:
    message = f"n={name},r=a,r=ab,s=c,i=4096,c=biws,r=ab".encode()
    users = load_users(path)
    return all(
        (c := users.scram_credentials(name, m)) is not None
        and verify_client_proof(c, message, client_proof(password, c, message))
        for m in ("SCRAM-SHA-256", "SCRAM-SHA-512"))


def test_add_list_passwd_access_key_delete(tmp_path, caplog) -> None:
    path = tmp_path / "conf" / "users.json"
    f = ["--users-file", str(path)]
    out = cli_ok(_run("add", "alice", "--password-stdin", "--role", "producer", *f,
                      input=PASSWORD + "\n"))
    assert out == "user alice added with role(s) producer\n"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert _logs_in(path, "alice", PASSWORD)

    # The prompt asks twice; the environment variable names the file.
    result = _run("add", "bob", "--role", "consumer", "--role", "admin",
                  input=f"{NEW_PASSWORD}\n{NEW_PASSWORD}\n", env={"TXBROKER_USERS_FILE": str(path)})
    cli_ok(result)
    assert NEW_PASSWORD not in result.output
    assert load_users(path).users["bob"].roles == ("admin", "consumer")

    out = cli_ok(_run("access-key", "alice", *f))
    key = out.split("accessKey: ")[1].split()[0]
    secret = out.split("secretKey: ")[1].split()[0]
    assert load_users(path).users["alice"].access_keys == {key: secret}

    listing = cli_ok(_run("list", *f))
    assert "alice  roles=producer  scram=SCRAM-SHA-256,SCRAM-SHA-512  " \
           f"access_keys={key}" in listing
    assert "bob  roles=admin,consumer" in listing and "2 user(s)" in listing
    stored = orjson.loads(path.read_bytes())["users"]["alice"]["scram"]["SCRAM-SHA-256"]
    for value in (secret, stored["salt"], stored["stored_key"], stored["server_key"]):
        assert value not in listing

    cli_ok(_run("passwd", "alice", "--password-stdin", *f, input=NEW_PASSWORD + "\n"))
    assert _logs_in(path, "alice", NEW_PASSWORD) and not _logs_in(path, "alice", PASSWORD)
    assert load_users(path).users["alice"].access_keys == {key: secret}  # kept

    cli_ok(_run("delete", "bob", *f))
    assert set(load_users(path).users) == {"alice"}

    raw = path.read_bytes()
    assert PASSWORD.encode() not in raw and NEW_PASSWORD.encode() not in raw
    assert PASSWORD not in caplog.text and NEW_PASSWORD not in caplog.text
    assert sorted(os.listdir(path.parent)) == [".users.json.lock", "users.json"]


def test_refusals_are_one_line_naming_the_file(tmp_path) -> None:
    path = tmp_path / "users.json"
    f = ["--users-file", str(path)]
    cli_ok(_run("add", "alice", "--password-stdin", *f, input="pw-1\n"))
    before = path.read_bytes()
    cases = [
        (("add", "alice", "--password-stdin", *f), "pw-2\n", "user 'alice' exists"),
        (("add", "bad,name", "--password-stdin", *f), "pw-3\n", "user name 'bad,name'"),
        (("add", "carol", "--password-stdin", *f), "\n", "password must not be empty"),
        (("passwd", "nobody", "--password-stdin", *f), "pw-4\n", "no user 'nobody'"),
        (("delete", "nobody", *f), None, "no user 'nobody'"),
        (("access-key", "nobody", *f), None, "no user 'nobody'"),
    ]
    for args, stdin, says in cases:
        err = cli_one_line_error(_run(*args, input=stdin))
        assert says in err and str(path) in err, err
        assert "pw-" not in err
    assert path.read_bytes() == before  # nothing written by a refused command

    path.write_bytes(b'{"version": 1, "users": {')
    for args in (("list", *f), ("delete", "alice", *f), ("access-key", "alice", *f)):
        err = cli_one_line_error(_run(*args))
        assert err.startswith(f"error: user {args[0]}: users file {path}: not valid JSON"), err


def test_cli_subprocess_and_a_running_store_sees_the_change(tmp_path) -> None:
    """The installed command in a process of its own, as an operator runs it, while a store
    (what a broker holds) picks the new user up without being rebuilt."""
    path = tmp_path / "users.json"
    env = {**os.environ, "TXBROKER_USERS_FILE": str(path)}
    cmd = [sys.executable, "-m", "txbroker", "user"]
    done = subprocess.run([*cmd, "add", "alice", "--password-stdin"], input=PASSWORD + "\n",
                          capture_output=True, text=True, env=env, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    clock = ManualClock()
    store = UserStore(path, clock=clock)
    assert store.scram_credentials("dave", "SCRAM-SHA-512") is None
    done = subprocess.run([*cmd, "add", "dave", "--password-stdin", "--role", "consumer"],
                          input=NEW_PASSWORD + "\n", capture_output=True, text=True, env=env,
                          timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert PASSWORD not in done.stderr + done.stdout and NEW_PASSWORD not in done.stderr
    clock.advance(store.check_interval)
    assert store.scram_credentials("dave", "SCRAM-SHA-512") is not None

    done = subprocess.run([*cmd, "delete", "nobody"], capture_output=True, text=True, env=env,
                          timeout=60, check=False)
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert done.stderr.strip().splitlines() == [
        f"error: user delete at users file {path}: no user 'nobody'"]
