"""``txbroker acl ...`` through the real CLI: what it writes to the users file, what it prints,
what it refuses (one error line), and that the users and their credentials stay."""

from __future__ import annotations

import subprocess
import sys

from click.testing import CliRunner
from support.cli_runner import cli_ok, cli_one_line_error

from txbroker.cli.main import main
from txbroker.service.kafka.acls import (
    AclBinding,
    AclOperation,
    AclPermission,
    PatternType,
    ResourceType,
)
from txbroker.service.users import load_users


def _run(*args: str):
    return CliRunner().invoke(main, ["acl", *args], catch_exceptions=False)


def test_add_list_delete(tmp_path) -> None:
    path = tmp_path / "users.json"
    f = ["--users-file", str(path)]
    cli_ok(CliRunner().invoke(main, ["user", "add", "bob", "--password-stdin", *f],
                              input="pw\n", catch_exceptions=False))
    before = load_users(path).users["bob"]
    out = cli_ok(_run("add", "--allow-principal", "User:bob", "--operation", "Read",
                      "--operation", "describe", "--topic", "orders", "--group", "g-",
                      "--resource-pattern-type", "prefixed", *f))
    assert out.count("added") == 4 and "TOPIC:PREFIXED:orders  User:bob has ALLOW permission " \
        "for operation READ from host *" in out
    cli_ok(_run("add", "--deny-principal", "User:*", "--deny-host", "10.0.0.66",
                "--operation", "IdempotentWrite", "--cluster", *f))
    cli_ok(_run("add", "--allow-principal", "User:bob", "--operation", "Write",
                "--transactional-id", "tx", *f))
    users = load_users(path)
    assert users.users["bob"] == before  # the user and its credentials are untouched
    assert AclBinding(ResourceType.CLUSTER, "kafka-cluster", PatternType.LITERAL, "User:*",
                      "10.0.0.66", AclOperation.IDEMPOTENT_WRITE, AclPermission.DENY) in users.acls
    assert len(users.acls) == 6
    assert users.authorizer.allowed("User:bob", "1.2.3.4", AclOperation.READ, ResourceType.GROUP,
                                    "g-1")
    listed = cli_ok(_run("list", *f))
    assert "6 ACL binding(s)" in listed
    applying = cli_ok(_run("list", "--topic", "orders-eu", "--resource-pattern-type", "match", *f))
    assert "2 ACL binding(s)" in applying and "GROUP" not in applying
    gone = cli_ok(_run("delete", "--principal", "User:bob", "--operation", "Read", *f))
    assert "2 ACL binding(s) deleted" in gone
    gone = cli_ok(_run("delete", "--group", "g-", "--resource-pattern-type", "prefixed", *f))
    assert "1 ACL binding(s) deleted" in gone
    assert len(load_users(path).acls) == 3
    again = cli_ok(_run("add", "--allow-principal", "User:bob", "--operation", "Write",
                        "--transactional-id", "tx", *f))
    assert "added" in again and len(load_users(path).acls) == 3  # the same binding once


def test_refusals_are_one_line(tmp_path) -> None:
    path = tmp_path / "users.json"
    f = ["--users-file", str(path)]
    err = cli_one_line_error(_run("add", "--allow-principal", "bob", "--operation", "Read",
                                  "--topic", "t", *f))
    assert f"users file {path}" in err and "User:<name>" in err
    err = cli_one_line_error(_run("add", "--allow-principal", "User:bob", "--operation", "Read",
                                  *f))
    assert "name a resource" in err
    err = cli_one_line_error(_run("add", "--operation", "Read", "--topic", "t", *f))
    assert "name a principal" in err
    err = cli_one_line_error(_run("delete", *f))
    assert "nothing is deleted wholesale" in err
    assert not path.exists()  # nothing was written
    path.write_text('{"version": 2, "users": {}, "acls": [{"resource_type": "TOPIK"}]}')
    err = cli_one_line_error(_run("list", *f))
    assert str(path) in err and "acls[0]" in err
    bad = _run("add", "--allow-principal", "User:bob", "--operation", "Reed", "--topic", "t", *f)
    assert bad.exit_code == 2 and "Reed" in bad.stderr and "Traceback" not in bad.output


def test_the_installed_command(tmp_path) -> None:
    path = tmp_path / "users.json"
    done = subprocess.run([sys.executable, "-m", "txbroker", "acl", "add", "--allow-principal",
                           "User:bob", "--operation", "All", "--topic", "*"],
                          env={"TXBROKER_USERS_FILE": str(path), "PATH": "/usr/bin:/bin"},
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert [b.operation for b in load_users(path).acls] == [AclOperation.ALL]
