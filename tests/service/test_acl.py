"""Access control without sockets: the signature against real client frames, the validator's
decisions, and the checks a plain_acl.yml must pass before a broker starts."""

from __future__ import annotations

import struct
from pathlib import Path

import orjson
import pytest

from txbroker.config import ConfigError, load_config
from txbroker.remoting.codec import FrameDecoder
from txbroker.remoting.codes import RequestCode, ResponseCode
from txbroker.remoting.signing import SessionCredentials, signature, signed_content
from txbroker.service.acl import validate
from txbroker.service.acl_rules import (
    AclConfigError,
    AddressPattern,
    load_acl_file,
    parse_acl,
)
from txbroker.store.record import encode_batch

VECTORS = Path(__file__).resolve().parents[1] / "vectors"


def _captured_body(d: dict) -> bytes | None:
    """The body as the client sent it, rebuilt from the capture; None if not exactly."""
    b = d.get("body")
    if b is None:
        body = b""
    elif b["kind"] == "json":
        body = orjson.dumps(b["json"])
    elif b["kind"] == "batch":
        body = encode_batch([(m["flag"], m["body"].encode(), m["properties"]) for m in b["messages"]])
    else:
        body = b["text"].encode()
    return body if len(body) == d["body_len"] else None  # e.g. a compressed body


def test_signature_equals_the_cpp_clients_on_every_captured_request() -> None:
    # The C++ client signs even with empty credentials (secret ""), so each frame it sent
    # carries the signature of its own ext fields and body.
    checked = with_body = 0
    for path in sorted(VECTORS.glob("*.jsonl")):
        for line in path.read_text().splitlines():
            d = orjson.loads(line)
            if d.get("dir") != "in":
                continue
            body = _captured_body(d)
            if body is None:
                continue
            header = d["header_raw"].encode()
            frame = struct.pack(">ii", 4 + len(header) + len(body), len(header)) + header + body
            [cmd] = FrameDecoder().feed(frame)  # numbers in extFields become Java's strings
            assert cmd.ext_fields["OnsChannel"] == "ALIYUN"
            assert signature("", cmd.ext_fields, cmd.body) == cmd.ext_fields["Signature"], \
                (path.name, d["code"])
            checked += 1
            with_body += bool(body)
    assert checked >= 400 and with_body >= 20, (checked, with_body)


def test_content_is_values_in_java_key_order_without_signature_then_body() -> None:
    ext = {"b": "2", "a": "1", "Signature": "x", "_UNIQUE_KEY_QUERY": "q", "AccessKey": "k",
           "\U0001F600": "astral", "\uFFFD": "bmp"}
    # Java sorts by UTF-16 code unit: the astral character (surrogate D83D) before U+FFFD.
    assert signed_content(ext, b"BODY") == b"k12astralbmp" + b"BODY"


def test_credentials_sign_after_the_other_fields() -> None:
    from txbroker.remoting.command import RemotingCommand

    cmd = RemotingCommand.request(RequestCode.SEND_MESSAGE, {"topic": "T"}, body=b"x")
    SessionCredentials("writer-key", "writer-secret").sign(cmd)
    assert cmd.ext_fields["AccessKey"] == "writer-key"
    assert cmd.ext_fields["Signature"] == signature("writer-secret", cmd.ext_fields, b"x")
    assert "writer-secret" not in repr(SessionCredentials("writer-key", "writer-secret"))


RULES = parse_acl({
    "globalWhiteRemoteAddresses": ["10.9.*.*", "192.168.0.{1,2}"],
    "accounts": [
        {"accessKey": "writer-key", "secretKey": 12345678, "defaultTopicPerm": "DENY",
         "defaultGroupPerm": "SUB", "topicPerms": ["Orders=PUB", "Audit=PUB|SUB", "Secret=DENY"]},
        {"accessKey": "reader-key", "secretKey": "reader-secret", "defaultTopicPerm": "SUB",
         "groupPerms": ["readers=SUB"], "topicPerms": ["Secret=DENY"],
         "whiteRemoteAddress": "10.1.1.1-20"},
        {"accessKey": "admin-key", "secretKey": "admin-secret", "admin": True},
        {"accessKey": "limited-admin", "secretKey": "admin-secret", "admin": True,
         "topicPerms": ["Orders=SUB"]},
    ],
})
SECRETS = {"writer-key": "12345678", "reader-key": "reader-secret", "admin-key": "admin-secret",
           "limited-admin": "admin-secret"}
HB = orjson.dumps({"clientID": "c", "consumerDataSet": [
    {"groupName": "readers", "subscriptionDataSet": [{"topic": "Orders", "subString": "*"}]}]})


def _check(code: int, ext: dict[str, str], key: str | None, body: bytes = b"",
           peer: str = "127.0.0.1", secret: str | None = None) -> str | None:
    ext = dict(ext)
    if key is not None:
        ext["AccessKey"] = key
        ext["Signature"] = signature(secret if secret is not None else SECRETS.get(key, "x"), ext, body)
    denied = validate(RULES, code, ext, body, peer)
    if denied is not None:
        assert denied.code == ResponseCode.SYSTEM_ERROR and denied.remark.startswith("AclException: ")
    return None if denied is None else denied.remark


SEND = RequestCode.SEND_MESSAGE
SEND2 = RequestCode.SEND_MESSAGE_V2
PULL = RequestCode.PULL_MESSAGE


@pytest.mark.parametrize("code, ext, key, kw, refusal", [
    (SEND, {"topic": "Orders"}, "writer-key", {}, None),
    (SEND2, {"b": "Orders", "a": "pg"}, "writer-key", {}, None),
    (RequestCode.SEND_BATCH_MESSAGE, {"b": "Secret"}, "writer-key", {}, "topic=Secret: accessKey=writer-key needs PUB, has DENY"),
    (SEND, {"topic": "Other"}, "writer-key", {}, "topic=Other: accessKey=writer-key needs PUB, has DENY"),
    (SEND, {"topic": "Orders"}, "reader-key", {}, "topic=Orders: accessKey=reader-key needs PUB, has SUB"),
    (RequestCode.RECALL_MESSAGE, {"topic": "Orders", "recallHandle": "h"}, "writer-key", {}, None),
    (RequestCode.RECALL_MESSAGE, {"topic": "Orders", "recallHandle": "h"}, "reader-key", {},
     "topic=Orders: accessKey=reader-key needs PUB, has SUB"),
    (SEND, {"topic": "Orders"}, None, {}, "No accessKey is configured"),
    (SEND, {"topic": "Orders"}, "nobody-key", {}, "No acl config for 'nobody-key'"),
    (SEND, {"topic": "Orders"}, "writer-key", {"secret": "wrong"}, "Check signature failed for accessKey=writer-key"),
    (SEND, {"topic": "Orders"}, "writer-key", {"peer": "10.9.3.4"}, None),  # signature wrong but white-listed
    (SEND, {"topic": "Orders"}, None, {"peer": "192.168.0.2"}, None),
    (SEND, {"topic": "Orders"}, None, {"peer": "192.168.0.3"}, "No accessKey"),
    (SEND, {"topic": "Orders"}, "reader-key", {"peer": "10.1.1.7", "secret": "x"}, None),  # account white list
    (SEND, {"topic": "Orders"}, "reader-key", {"peer": "10.1.1.21"}, "needs PUB, has SUB"),
    (PULL, {"topic": "Orders", "consumerGroup": "readers"}, "reader-key", {}, None),
    (PULL, {"topic": "Orders", "consumerGroup": "others"}, "reader-key", {}, "group=others: accessKey=reader-key needs SUB, has DENY"),
    (PULL, {"topic": "Orders", "consumerGroup": "g"}, "writer-key", {}, "topic=Orders: accessKey=writer-key needs SUB, has PUB"),
    (PULL, {"topic": "Secret", "consumerGroup": "readers"}, "reader-key", {}, "topic=Secret"),
    (PULL, {"topic": "%RETRY%readers", "consumerGroup": "readers"}, "reader-key", {}, None),
    (RequestCode.QUERY_MESSAGE, {"topic": "Audit"}, "writer-key", {}, None),
    (RequestCode.CONSUMER_SEND_MSG_BACK, {"group": "readers", "originTopic": "Orders"}, "reader-key", {}, "topic=Orders"),
    (RequestCode.UPDATE_CONSUMER_OFFSET, {"consumerGroup": "readers", "topic": "Orders"}, "reader-key", {}, None),
    (RequestCode.QUERY_CONSUMER_OFFSET, {"consumerGroup": "nope", "topic": "Orders"}, "reader-key", {}, "group=nope"),
    (RequestCode.GET_CONSUMER_LIST_BY_GROUP, {"consumerGroup": "nope"}, "reader-key", {}, "group=nope"),
    (RequestCode.UNREGISTER_CLIENT, {"clientID": "c", "producerGroup": "pg", "consumerGroup": ""}, "reader-key", {}, None),
    (RequestCode.HEART_BEAT, {}, "reader-key", {"body": HB}, None),
    (RequestCode.HEART_BEAT, {}, "writer-key", {"body": HB}, "topic=Orders: accessKey=writer-key needs SUB, has PUB"),
    (RequestCode.HEART_BEAT, {}, "writer-key", {"body": b"{not json"}, "cannot read the heartbeat"),
    (RequestCode.END_TRANSACTION, {"producerGroup": "pg"}, "reader-key", {}, None),  # no resource in 4.x
    (RequestCode.UPDATE_AND_CREATE_TOPIC, {"topic": "New"}, "writer-key", {}, "Need admin permission for request code=17, but accessKey=writer-key is not"),
    (RequestCode.TXN_DECIDE, {"id": "x", "decision": "commit"}, "reader-key", {}, "Need admin permission"),
    (RequestCode.RESUME_CHECK_HALF_MESSAGE, {"msgId": "x"}, "writer-key", {}, "Need admin permission"),
    (RequestCode.UPDATE_AND_CREATE_TOPIC, {"topic": "New"}, "admin-key", {}, None),
    (SEND, {"topic": "Anything"}, "admin-key", {}, None),  # admin without resource entries
    (SEND, {"topic": "Orders"}, "limited-admin", {}, "needs PUB, has SUB"),  # entries still count
    (SEND, {"topic": "Anything"}, "limited-admin", {}, "has DENY"),  # and defaults DENY
])
def test_validator_decisions(code, ext, key, kw, refusal) -> None:
    remark = _check(code, ext, key, **kw)
    if refusal is None:
        assert remark is None
    else:
        assert remark is not None and refusal in remark


def test_signature_covers_body_and_every_field() -> None:
    ext = {"topic": "Orders", "AccessKey": "writer-key"}
    ext["Signature"] = signature("12345678", ext, b"body")
    assert validate(RULES, SEND, ext, b"body", "127.0.0.1") is None
    assert "Check signature" in validate(RULES, SEND, ext, b"bodY", "127.0.0.1").remark
    assert "Check signature" in validate(RULES, SEND, {**ext, "queueId": "1"}, b"body", "127.0.0.1").remark


@pytest.mark.parametrize("pattern, yes, no", [
    ("*", ["1.2.3.4", "::1"], []),
    ("127.0.0.1", ["127.0.0.1", "::ffff:127.0.0.1"], ["127.0.0.2"]),
    ("127.0.0.*", ["127.0.0.9"], ["127.0.1.9"]),
    ("10.*.*.*", ["10.200.3.4"], ["11.0.0.1"]),
    ("10.1.*", ["10.1.200.3"], ["10.2.0.1"]),
    ("10.1.1.1-20", ["10.1.1.1", "10.1.1.20"], ["10.1.1.21", "10.1.2.5"]),
    ("1.1.1.1,2.2.2.2", ["2.2.2.2"], ["3.3.3.3"]),
    ("192.168.0.{1,2}", ["192.168.0.1"], ["192.168.0.3"]),
    ("::1", ["::1", "0:0:0:0:0:0:0:1"], ["127.0.0.1"]),
    ("fe80:0:0:0:0:0:0:1-ff", ["fe80::a"], ["fe80::1:0"]),
])
def test_address_patterns(pattern, yes, no) -> None:
    p = AddressPattern.parse(pattern)
    assert all(p.matches(h) for h in yes)
    assert not any(p.matches(h) for h in no)
    assert not p.matches("not-an-address") or p.any


@pytest.mark.parametrize("text, fragment", [
    ("accounts: {accessKey: x}", "accounts must be a list"),
    ("accounts:\n  - {accessKey: short, secretKey: long-enough}", "accessKey must be a string longer than 6"),
    ("accounts:\n  - {accessKey: long-enough, secretKey: 123}", "secretKey must be a string longer than 6"),
    ("accounts:\n  - {accessKey: long-enough, secretKey: long-enough, defaultTopicPerm: READ}", "'READ' is not a permission"),
    ("accounts:\n  - {accessKey: long-enough, secretKey: long-enough, topicPerms: [Orders]}", "must look like 'name=PUB|SUB'"),
    ("accounts:\n  - {accessKey: long-enough, secretKey: long-enough, topicPerm: [A=PUB]}", "unknown key(s) topicPerm"),
    ("accounts:\n  - {accessKey: long-enough, secretKey: long-enough, admin: yes-please}", "admin must be true or false"),
    ("accounts:\n  - {accessKey: long-enough, secretKey: long-enough, whiteRemoteAddress: 300.1.1.1}", "not an IPv4 or IPv6 address"),
    ("accounts:\n  - {accessKey: long-enough, secretKey: long-enough}\n  - {accessKey: long-enough, secretKey: other-secret}", "listed twice"),
    ("globalWhiteRemoteAddresses: [10.0.0.1-300]", "outside 0..255"),
    ("accounts:\n  - {accessKey: long-enough, secretKey: long-enough, whiteRemoteAddress: [1.1.1.1]}", "must be one address pattern"),
    ("acounts: []", "unknown top-level key(s) acounts"),
    ("accounts: [\n", "not valid YAML"),
])
def test_invalid_files_are_refused_with_the_entry_named(tmp_path, text, fragment) -> None:
    path = tmp_path / "plain_acl.yml"
    path.write_text(text)
    with pytest.raises(AclConfigError) as info:
        load_acl_file(path)
    assert fragment in str(info.value) and str(path) in str(info.value)
    assert isinstance(info.value, ConfigError)


def test_rocketmq_sample_file_loads(tmp_path) -> None:
    # The shape of RocketMQ 4.9's distribution/conf/plain_acl.yml (numbers as secrets,
    # blank whiteRemoteAddress, dataVersion written back by the broker).
    path = tmp_path / "plain_acl.yml"
    path.write_text("""\
globalWhiteRemoteAddresses:
  - 10.10.103.*
  - 192.168.0.*
accounts:
  - accessKey: RocketMQ
    secretKey: 12345678
    whiteRemoteAddress:
    admin: false
    defaultTopicPerm: DENY
    defaultGroupPerm: SUB
    topicPerms:
      - topicA=DENY
      - topicB=PUB|SUB
      - topicC=SUB
    groupPerms:
      - groupA=DENY
      - groupB=PUB|SUB
      - groupC=SUB
  - accessKey: rocketmq2
    secretKey: 12345678
    whiteRemoteAddress: 192.168.1.*
    admin: true
dataVersion:
  - counter: 1
    timestamp: 1
""")
    rules = load_acl_file(path)
    assert set(rules.accounts) == {"RocketMQ", "rocketmq2"}
    assert rules.accounts["RocketMQ"].secret_key == "12345678"
    assert rules.accounts["RocketMQ"].white_remote_address is None
    assert rules.accounts["rocketmq2"].admin


def test_acl_file_setting_follows_the_config_pattern(tmp_path) -> None:
    assert load_config(None, {}).acl_file is None  # off by default
    assert load_config(None, {"TXBROKER_ACL_FILE": "/etc/acl.yml"}).acl_file == "/etc/acl.yml"
    assert load_config({"acl_file": "b.yml"}, {"TXBROKER_ACL_FILE": "a.yml"}).acl_file == "b.yml"
    with pytest.raises(ConfigError, match="acl_file"):
        load_config({"acl_file": " "}, {})
