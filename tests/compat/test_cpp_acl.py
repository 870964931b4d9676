"""The unmodified RocketMQ C++ client with session credentials against a broker running ACL.

The client signs every request (``set_session_credentials``, ClientRPCHook); the broker must
accept its signature with the right secret and refuse it with a wrong one.
"""

from __future__ import annotations

import pytest
from compat_cpp import run_cpp

from txbroker.broker import Broker

pytestmark = pytest.mark.needs_cpp

ACL = """\
accounts:
  - accessKey: cpp-producer
    secretKey: cpp-secret-1
    topicPerms: [CompatAcl=PUB]
"""


@pytest.fixture
async def acl_broker(broker_config, tmp_path):
    path = tmp_path / "plain_acl.yml"
    path.write_text(ACL)
    b = Broker(broker_config.replace(acl_file=str(path)))
    await b.start()
    try:
        yield b
    finally:
        await b.stop()


async def test_cpp_producer_with_right_credentials_sends(acl_broker, tmp_path) -> None:
    run = await run_cpp(tmp_path / "home", scenario="send_sync", namesrv=acl_broker.namesrv_addr,
                        topic="CompatAcl", group="PID_ACL", count=3, body="signed",
                        access_key="cpp-producer", secret_key="cpp-secret-1")
    run.assert_clean()
    assert [r["status"] for r in run.of("sent")] == [0, 0, 0]
    bodies = sorted(m.body for q in acl_broker.store.queues()["CompatAcl"]
                    for m in acl_broker.store.get("CompatAcl", q, 0, 100).messages())
    assert bodies == [b"signed 0", b"signed 1", b"signed 2"]


async def test_cpp_producer_with_wrong_secret_is_refused(acl_broker, tmp_path) -> None:
    run = await run_cpp(tmp_path / "home", scenario="send_sync", namesrv=acl_broker.namesrv_addr,
                        topic="CompatAcl", group="PID_ACL", count=1, body="forged",
                        access_key="cpp-producer", secret_key="not-the-secret")
    assert run.returncode == 0, run.describe()
    assert not run.of("sent") and run.of("error"), run.describe()
    assert "CompatAcl" not in acl_broker.store.queues()
    assert acl_broker.acl.refused >= 1
