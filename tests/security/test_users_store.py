"""The users file: its form, atomic 0600 writes, reload on change, the answers acl.py needs."""

from __future__ import annotations

import logging
import os
import stat

import pytest
from support.clock import ManualClock
from support.scram_client import client_proof

from txbroker.remoting.codes import RequestCode
from txbroker.remoting.command import RemotingCommand
from txbroker.remoting.signing import SessionCredentials
from txbroker.service.acl import validate
from txbroker.service.acl_rules import Account, AclRules, Perm
from txbroker.service.scram import verify_client_proof
from txbroker.service.users import (
    Users,
    UsersFileError,
    UserStore,
    decode_users,
    encode_users,
    load_users,
    write_users,
)

PASSWORD = "correct horse battery staple"



def test_file_round_trip_keeps_credentials_and_never_the_password(tmp_path) -> None:
    users = Users().with_password("alice", PASSWORD, ("consumer", "producer"))
    users, key, secret = users.with_access_key("alice")
    path = tmp_path / "users.json"
    write_users(path, users)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    raw = path.read_bytes()
    assert PASSWORD.encode() not in raw
    again = load_users(path)
    assert again == decode_users(encode_users(users)) and again.users["alice"].roles == (
        "producer", "consumer")
    for mechanism in ("SCRAM-SHA-256", "SCRAM-SHA-512"):
        creds = again.scram_credentials("alice", mechanism)
        assert creds is not None and creds.iterations == 4096
        message = b"n=alice,r=x,r=xy,s=s,i=4096,c=biws,r=xy"
        assert verify_client_proof(creds, message, client_proof(PASSWORD, creds, message))
        assert not verify_client_proof(creds, message, client_proof(PASSWORD + "!", creds,
                                                                   message))
    assert again.scram_credentials("bob", "SCRAM-SHA-256") is None
    assert again.scram_credentials("alice", "PLAIN") is None
    assert again.users["alice"].access_keys == {key: secret}
    assert secret not in repr(again)


def test_write_replaces_a_file_with_loose_permissions(tmp_path) -> None:
    path = tmp_path / "users.json"
    path.write_text("{}")
    os.chmod(path, 0o644)
    write_users(path, Users().with_password("alice", PASSWORD))
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert [p.name for p in tmp_path.iterdir()] == ["users.json"]  # no temporary left


@pytest.mark.parametrize("content, says", [
    (b"{", "not valid JSON"),
    (b"[]", "version 1"),
    (b'{"version": 1, "users": []}', '"users" must be an object'),
    (b'{"version": 1, "users": {"a b": {}}}', "user name 'a b'"),
    (b'{"version": 1, "users": {"al": {"roles": ["root"]}}}', "unknown role(s) root"),
    ((b'{"version": 1, "users": {"al": {"scram": {"SCRAM-SHA-256": {"salt": "!", '
      b'"iterations": 4096, "stored_key": "", "server_key": ""}}}}}'), "user 'al'"),
    ((b'{"version": 1, "users": {"a": {"access_keys": {"AK1234567": "s"}}, '
      b'"b": {"access_keys": {"AK1234567": "t"}}}}'), "belongs to two users"),
])
def test_a_bad_file_is_one_error_naming_the_file(tmp_path, content, says) -> None:
    path = tmp_path / "users.json"
    path.write_bytes(content)
    with pytest.raises(UsersFileError) as err:
        load_users(path)
    assert str(err.value).startswith(f"users file {path}: ") and says in str(err.value)
    assert "\n" not in str(err.value)


def test_missing_file_is_an_error_for_the_broker(tmp_path) -> None:
    with pytest.raises(UsersFileError, match="no such file"):
        UserStore(tmp_path / "nope.json")
    assert load_users(tmp_path / "nope.json", missing_ok=True) == Users()


def test_store_reloads_on_change_and_keeps_the_old_users_on_a_bad_file(tmp_path, caplog) -> None:
    path = tmp_path / "users.json"
    write_users(path, Users().with_password("alice", PASSWORD))
    clock = ManualClock()
    store = UserStore(path, check_interval=1.0, clock=clock)
    assert store.scram_credentials("alice", "SCRAM-SHA-256") is not None
    assert store.scram_credentials("bob", "SCRAM-SHA-256") is None

    write_users(path, load_users(path).with_password("bob", "another one"))
    assert store.scram_credentials("bob", "SCRAM-SHA-256") is None  # not looked at yet
    clock.advance(1.0)
    assert store.scram_credentials("bob", "SCRAM-SHA-256") is not None
    assert store.reloads == 1
    clock.advance(1.0)
    assert store.current() is store.current() and store.reloads == 1  # unchanged: not read

    caplog.set_level(logging.INFO, logger="txbroker.service.users")
    path.write_bytes(b'{"version": 1, "users": {"alice": ')
    clock.advance(1.0)
    assert set(store.current().users) == {"alice", "bob"}
    clock.advance(1.0)
    store.current()
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1 and str(path) in errors[0] and "previous users" in errors[0]

    write_users(path, Users().with_password("carol", PASSWORD))
    clock.advance(1.0)
    assert set(store.current().users) == {"carol"}
    assert PASSWORD not in caplog.text


def _signed(code: int, ext: dict[str, str], key: str, secret: str) -> RemotingCommand:
    cmd = RemotingCommand(code=code, ext_fields=dict(ext))
    SessionCredentials(key, secret).sign(cmd)
    return cmd


def test_access_keys_answer_the_plain_acl_lookups(tmp_path) -> None:
    users = Users().with_password("pub", PASSWORD, ("producer",))
    users, pub_key, pub_secret = users.with_access_key("pub")
    users = users.with_password("sub", PASSWORD, ("consumer",))
    users, sub_key, sub_secret = users.with_access_key("sub")
    users = users.with_password("root", PASSWORD, ("admin",))
    users, root_key, root_secret = users.with_access_key("root")
    base = AclRules((), {"fileaccount": Account("fileaccount", "12345678secret")})
    rules = users.acl_rules(base)
    assert set(rules.accounts) == {"fileaccount", pub_key, sub_key, root_key}

    def check(code, ext, key, secret):
        cmd = _signed(code, ext, key, secret)
        return validate(rules, cmd.code, cmd.ext_fields, cmd.body, "127.0.0.1")

    send = (RequestCode.SEND_MESSAGE_V2, {"a": "grp", "b": "TopicA"})
    pull = (RequestCode.PULL_MESSAGE, {"topic": "TopicA", "consumerGroup": "g1"})
    create = (RequestCode.UPDATE_AND_CREATE_TOPIC, {"topic": "TopicB"})
    assert check(*send, pub_key, pub_secret) is None
    assert "needs SUB" in check(*pull, pub_key, pub_secret).remark
    assert check(*pull, sub_key, sub_secret) is None
    assert "needs PUB" in check(*send, sub_key, sub_secret).remark
    assert "Need admin" in check(*create, sub_key, sub_secret).remark
    assert check(*create, root_key, root_secret) is None
    assert "Check signature failed" in check(*send, pub_key, sub_secret).remark
    assert rules.accounts[pub_key].default_group_perm == Perm.DENY

    clash = AclRules((), {pub_key: Account(pub_key, "12345678secret")})
    with pytest.raises(UsersFileError, match=f"access key\\(s\\) {pub_key} are in the ACL file"):
        users.acl_rules(clash)
