"""The envelope of Kafka requests between brokers (forwarded admin requests, markers), without
I/O: the verdict a receiving broker leaves in ``ctx.cluster_peer``."""

from __future__ import annotations

import pytest

from txbroker.remoting.envelope import MAX_CLOCK_SKEW, ReplayGuard
from txbroker.remoting.kafka.apis import ApiKey
from txbroker.service.cluster_auth import CLUSTER_ACCESS_KEY
from txbroker.service.kafka.context import KafkaRequestContext
from txbroker.service.kafka.peer_auth import CLUSTER_PRINCIPAL
from txbroker.service.kafka.peer_envelope import (
    CLUSTER_APIS,
    canonical,
    signed_client_id,
    verdict,
    verify_peers,
)

SECRET = "cluster-secret-1"
NOW = 1_800_000_000.0
KEY, VERSION = ApiKey.CREATE_TOPICS, 4
BODY = canonical(KEY, VERSION, {"topics": [{"name": "orders", "num_partitions": 3,
                                            "replication_factor": 1, "assignments": [],
                                            "configs": []}], "timeout_ms": 1000})


HERE = "broker-b"


def _ctx(client_id: str, *, key: int = KEY, version: int = VERSION,
         principal: str | None = None) -> KafkaRequestContext:
    ctx = KafkaRequestContext(key, version, 7, client_id, "127.0.0.1:5555", 1)
    ctx.principal = principal
    return ctx


def _cid(secret: str = SECRET, *, now: float = NOW, nonce: int = 1, body: dict = BODY,
         to: str = HERE) -> str:
    return signed_client_id(KEY, VERSION, body, secret, to=to, now=now,
                            nonce=nonce.to_bytes(16, "big"))


def test_a_client_is_not_a_peer_and_costs_no_check() -> None:
    guard = ReplayGuard()
    assert verdict(_ctx("my-app"), BODY, SECRET, HERE, guard, NOW) is False
    assert len(guard) == 0


def test_a_signed_request_is_a_peer_once() -> None:
    guard = ReplayGuard()
    cid = _cid()
    assert cid.startswith(f"{CLUSTER_ACCESS_KEY}:") and len(cid) < 200
    assert verdict(_ctx(cid), BODY, SECRET, HERE, guard, NOW + 1) is True
    assert "repeats a nonce" in str(verdict(_ctx(cid), BODY, SECRET, HERE, guard, NOW + 2))


@pytest.mark.parametrize("ctx, body, why", [
    (_ctx(_cid("another-secret")), BODY, "not signed with this cluster's"),
    (_ctx(_cid()), {**BODY, "timeout_ms": 1}, "not signed with this cluster's"),        # body
    (_ctx(_cid(), version=3), BODY, "not signed with this cluster's"),                 # version
    (_ctx(_cid(), key=ApiKey.DELETE_TOPICS), BODY, "not signed with this cluster's"),  # API
    (_ctx(_cid(now=NOW - MAX_CLOCK_SKEW - 1)), BODY, "outside the accepted window"),   # stale
    (_ctx(f"{CLUSTER_ACCESS_KEY}:00"), BODY, "not signed with this cluster's"),        # old form
    (_ctx(CLUSTER_ACCESS_KEY), BODY, "not signed"),                                    # bare
    (_ctx(_cid(to="broker-c")), BODY, "not signed with this cluster's"),        # another group
    (_ctx(_cid(), principal="User:bob"), BODY, "logged in as User:bob"),        # a user's login
])
def test_what_is_refused(ctx: KafkaRequestContext, body: dict, why: str) -> None:
    got = verdict(ctx, body, SECRET, HERE, ReplayGuard(), NOW)
    assert isinstance(got, str) and why in got, got


def test_without_a_secret_the_bare_name_marks_a_forwarded_request_and_nothing_else() -> None:
    guard = ReplayGuard()
    assert verdict(_ctx(CLUSTER_ACCESS_KEY), BODY, None, HERE, guard, NOW) is True
    assert isinstance(verdict(_ctx(_cid()), BODY, None, HERE, guard, NOW), str)


def test_the_cluster_account_login_is_a_broker() -> None:
    ctx = _ctx(_cid(), principal=CLUSTER_PRINCIPAL)
    assert verdict(ctx, BODY, SECRET, HERE, ReplayGuard(), NOW) is True


async def test_the_gate_checks_once_and_only_the_cluster_apis() -> None:
    seen: list[bool | str] = []

    async def handler(ctx: KafkaRequestContext, body: dict) -> dict:
        seen.append(ctx.cluster_peer)
        return {}

    gated = verify_peers({KEY: handler, ApiKey.PRODUCE: handler}, SECRET, HERE,
                         clock=lambda: NOW)
    assert ApiKey.WRITE_TXN_MARKERS in CLUSTER_APIS and ApiKey.PRODUCE not in CLUSTER_APIS
    assert gated[ApiKey.PRODUCE] is handler  # the hot path is not wrapped
    cid = _cid()
    await gated[KEY](_ctx(cid), BODY)
    await gated[KEY](_ctx(cid), BODY)
    assert seen[0] is True and "repeats a nonce" in str(seen[1])
