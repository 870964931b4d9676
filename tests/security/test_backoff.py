"""Brute force on the RocketMQ port: a real broker with a plain_acl.yml on 127.0.0.1 port 0 and
raw RemotingClients signing with good and bad credentials.  Bounds are generous: the back-off
doubles from 0.1 s, and only "slower than the first answers" and "faster than the back-off"
are asserted."""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path

import pytest

from txbroker.broker import Broker
from txbroker.remoting.client import RemotingClient
from txbroker.remoting.codes import RequestCode, ResponseCode
from txbroker.remoting.command import RemotingCommand
from txbroker.remoting.signing import SIGNATURE, SessionCredentials

ACL = """\
accounts:
  - accessKey: writer-key
    secretKey: writer-secret
    defaultTopicPerm: PUB
"""
GOOD = SessionCredentials("writer-key", "writer-secret")
WRONG = SessionCredentials("writer-key", "guessed-secret")
UNKNOWN = SessionCredentials("nobody-key", "guessed-secret")


@pytest.fixture
async def acl_broker(broker_config, tmp_path: Path):
    path = tmp_path / "plain_acl.yml"
    path.write_text(ACL)
    b = Broker(broker_config.replace(acl_file=str(path)))
    await b.start()
    try:
        yield b
    finally:
        await b.stop()


async def _timed(client: RemotingClient) -> tuple[float, RemotingCommand, RemotingCommand]:
    """(seconds to the answer, the answer, the request as sent, signature included)."""
    cmd = RemotingCommand.request(RequestCode.GET_BROKER_CLUSTER_INFO)
    t0 = time.monotonic()
    resp = await client.invoke(cmd, 20.0)
    return time.monotonic() - t0, resp, cmd


def _refused(resp: RemotingCommand) -> bool:
    return resp.code == ResponseCode.SYSTEM_ERROR and resp.remark.startswith("AclException:")


async def test_bad_signatures_get_slower_answers_and_a_good_client_is_not_held_up(
        acl_broker: Broker, caplog) -> None:
    caplog.set_level(logging.DEBUG, logger="txbroker.service.acl")
    guard = acl_broker.acl
    assert guard is not None
    guesser = RemotingClient(acl_broker.broker_addr, credentials=WRONG)
    stranger = RemotingClient(acl_broker.broker_addr, credentials=UNKNOWN)
    good = RemotingClient(acl_broker.broker_addr, credentials=GOOD)
    try:
        # Failures 1-5 (a wrong secret, then an unknown key): back-offs 0, 0.1, 0.2, 0.4, 0.8 s.
        timings, sent = [], []
        for client in (guesser, guesser, guesser, stranger, guesser):
            took, resp, cmd = await _timed(client)
            assert _refused(resp), (resp.code, resp.remark)
            timings.append(took)
            sent.append(cmd)
        assert timings[0] < 0.5  # the first failure is answered at once
        assert timings[4] >= 0.6, timings  # the fifth waited for its back-off (0.8 s)
        assert guard.throttle.delay("127.0.0.1") >= 1.0  # 1.6 s for the next

        # The sixth waits 1.6 s; meanwhile the broker answers another connection at once: the
        # back-off delays that answer only, not the loop.
        pending = asyncio.create_task(_timed(guesser))
        await asyncio.sleep(0.2)  # the sixth is read and waiting for its back-off
        assert not pending.done()
        took_good, resp, _ = await _timed(good)
        assert resp.code == ResponseCode.SUCCESS, (resp.code, resp.remark)
        assert took_good < 1.0, took_good
        assert not pending.done()  # the refusal is still held back
        took, resp, _ = await asyncio.wait_for(pending, 20.0)
        assert _refused(resp) and took >= 1.2, took

        # The good client's success forgot the address: its next failure is answered at once.
        assert guard.throttle.delay("127.0.0.1") == 0.0
        took, resp, _ = await _timed(guesser)
        assert _refused(resp) and took < 0.5, took
    finally:
        for client in (guesser, stranger, good):
            await client.close()

    # One line for the address and the key, none with the secret or a signature.
    lines = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(lines) == 1, lines
    assert lines[0].startswith("authentication failed from 127.0.0.1:")
    assert "access key 'writer-key'" in lines[0]
    for cmd in sent:
        assert cmd.ext_fields[SIGNATURE] not in caplog.text
    assert "guessed-secret" not in caplog.text and "writer-secret" not in caplog.text
    assert guard.refused == 7


async def test_an_unsigned_request_does_not_reset_the_back_off(acl_broker: Broker) -> None:
    """Only a request that proves valid credentials forgets the address; one without an
    access key (refused too) does not, or a guesser would interleave them."""
    guard = acl_broker.acl
    assert guard is not None
    guesser = RemotingClient(acl_broker.broker_addr, credentials=WRONG)
    anonymous = RemotingClient(acl_broker.broker_addr)
    try:
        for _ in range(3):
            _, resp, _ = await _timed(guesser)
            assert _refused(resp)
        before = guard.throttle.delay("127.0.0.1")
        assert before >= 0.4
        _, resp, _ = await _timed(anonymous)
        assert _refused(resp) and "No accessKey" in resp.remark
        assert guard.throttle.delay("127.0.0.1") == before
    finally:
        await guesser.close()
        await anonymous.close()


def test_a_success_forgets_the_back_off_but_not_the_last_log_line() -> None:
    from txbroker.service.auth_throttle import AuthThrottle

    now = [500.0]
    t = AuthThrottle(lambda: now[0])
    assert t.failed("10.0.0.1") is True and t.failed("10.0.0.1") is False
    assert t.delay("10.0.0.1") == pytest.approx(0.2)
    t.succeeded("10.0.0.1")
    assert t.delay("10.0.0.1") == 0.0
    assert t.failed("10.0.0.1") is False  # still the same minute: no second line
    assert t.delay("10.0.0.1") == pytest.approx(0.1)  # counting starts again
    now[0] += 61
    assert t.failed("10.0.0.1") is True
