"""How frames travel over TLS: the frames of one flush leave as one TLS record.

The TLS transport encrypts each buffer it is handed as a record of its own, and the peer
decrypts record by record, so frames written apart cost both ends a record each.  A proxy
between a real TLS client and a real broker watches the bytes and counts the records."""

from __future__ import annotations

import asyncio

from txbroker.bench.chaos.faultproxy import FaultProxy
from txbroker.remoting.client import RemotingClient
from txbroker.remoting.codes import RequestCode, ResponseCode
from txbroker.remoting.command import RemotingCommand
from txbroker.remoting.tls import ClientTLS

#: TLS record content type of application data (RFC 8446 §5.1); in TLS 1.3 every record
#: after the ClientHello/ServerHello is sent as one.
APPLICATION_DATA = 23
REQUESTS = 32


def application_records(stream: bytes) -> int:
    """Application-data records in a byte stream of TLS records (5-byte headers)."""
    count = pos = 0
    while pos + 5 <= len(stream):
        count += stream[pos] == APPLICATION_DATA
        pos += 5 + int.from_bytes(stream[pos + 3:pos + 5], "big")
    return count


async def test_requests_and_answers_of_one_turn_leave_as_one_record_each_way(tls_broker,
                                                                            pki) -> None:
    b = await tls_broker(tls_mode="enforcing")
    host, port = b.broker_addr.rsplit(":", 1)
    seen = {True: bytearray(), False: bytearray()}  # to the server, to the client

    def watch(to_server: bool, chunk: bytes) -> bool:
        seen[to_server] += chunk
        return False  # never cut: the proxy only watches

    proxy = await FaultProxy(host, int(port), cut_when=watch).start()
    client = RemotingClient(proxy.addr, ssl=ClientTLS(ca=str(pki.ca_file)).context())
    try:
        def ask() -> RemotingCommand:
            return RemotingCommand.request(RequestCode.GET_BROKER_CLUSTER_INFO)

        assert (await client.invoke(ask(), 5.0)).code == ResponseCode.SUCCESS  # handshake done
        before = {d: application_records(bytes(s)) for d, s in seen.items()}
        answers = await asyncio.gather(*(client.invoke(ask(), 5.0) for _ in range(REQUESTS)))
        assert all(a.code == ResponseCode.SUCCESS for a in answers)
        after = {d: application_records(bytes(s)) for d, s in seen.items()}
    finally:
        await client.close()
        await proxy.close()
    # 32 requests issued in one loop turn are one flush; the broker reads them at once and
    # answers them in one flush too (a little slack for a read split by the network).
    assert after[True] - before[True] <= 2, (before, after)
    assert after[False] - before[False] <= 4, (before, after)
