"""The RocketMQ C++ client (rocketmq==0.4.4) and a broker with TLS on its ports.

The client build in that wheel has no TLS (docs/security.md, "The C++ client and TLS": its
core is a 2018 build without OpenSSL, and the C API it exports has no TLS switch), so the way
it keeps working while a cluster moves to TLS is ``tls_mode=permissive``: plaintext and TLS on
the same ports.  Here a plaintext C++ producer and consumer share a permissive broker with an
SDK producer speaking TLS, and an enforcing broker turns the C++ client away with nothing
stored.
"""

from __future__ import annotations

import pytest
from compat_cpp import run_cpp

from txbroker.bench.pki import ThrowawayPki
from txbroker.broker import Broker
from txbroker.client import Message, Producer

pytestmark = pytest.mark.needs_cpp

TOPIC = "CompatTls"


@pytest.fixture
def pki():
    with ThrowawayPki() as made:
        yield made


@pytest.fixture
async def tls_broker(broker_config, pki):
    """A factory: ``await tls_broker("permissive")`` starts a broker serving the throwaway
    certificate on its broker port and its embedded name server's port."""
    started: list[Broker] = []

    async def start(mode: str) -> Broker:
        b = Broker(broker_config.replace(tls_mode=mode, tls_cert=str(pki.cert),
                                         tls_key=str(pki.key)))
        await b.start()
        started.append(b)
        return b

    yield start
    for b in started:
        await b.stop()


def stored_bodies(broker: Broker) -> list[bytes]:
    return sorted(m.body for q in broker.store.queues().get(TOPIC, [])
                  for m in broker.store.get(TOPIC, q, 0, 100).messages())


async def test_plaintext_cpp_client_and_tls_sdk_share_a_permissive_broker(tls_broker, pki,
                                                                         tmp_path) -> None:
    b = await tls_broker("permissive")
    async with Producer("PID_TLS_SDK", b.namesrv_addr, tls=pki.client_tls()) as producer:
        await producer.send(Message(TOPIC, b"sdk over tls"))
        conn = producer._instance._conns[b.broker_addr]
        assert conn._proto.transport.get_extra_info("ssl_object") is not None

    sent = await run_cpp(tmp_path / "producer", scenario="send_sync", namesrv=b.namesrv_addr,
                         topic=TOPIC, group="PID_TLS_CPP", count=3, body="cpp plaintext")
    sent.assert_clean()
    assert [r["status"] for r in sent.of("sent")] == [0, 0, 0]  # SEND_OK

    consumed = await run_cpp(tmp_path / "consumer", timeout=30, scenario="push_consume",
                             namesrv=b.namesrv_addr, topic=TOPIC, group="CID_TLS_CPP", expect=4,
                             max_seconds=20)
    assert consumed.returncode == 0, consumed.describe()
    expected = [b"cpp plaintext 0", b"cpp plaintext 1", b"cpp plaintext 2", b"sdk over tls"]
    assert sorted(m["body"].encode() for m in consumed.of("msg")) == expected, consumed.describe()
    assert stored_bodies(b) == expected
    assert b.server.tls_refusals == 0 and b.namesrv_server.tls_refusals == 0


async def test_enforcing_broker_turns_the_cpp_client_away(tls_broker, tmp_path) -> None:
    b = await tls_broker("enforcing")
    # The client keeps reconnecting to a port that closes it (its send neither succeeds nor
    # returns soon), so the run is cut at its deadline: what matters is what it never got.
    run = await run_cpp(tmp_path / "producer", timeout=10, scenario="send_sync",
                        namesrv=b.namesrv_addr, topic=TOPIC, group="PID_TLS_CPP", count=1,
                        body="refused", send_timeout_ms=2000)
    assert not run.of("sent"), run.describe()
    assert stored_bodies(b) == []
    assert b.namesrv_server.tls_refusals >= 1  # its first connection: the name server's port
