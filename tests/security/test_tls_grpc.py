"""The gRPC endpoint with ``tls_mode`` set: TLS only, with the broker's certificate; a client
trusting the CA sends, a plaintext client gets no answer, and with ``tls_client_auth=required``
only a client presenting a certificate of the CA is served."""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest

from tests.grpc.raw import client_metadata, message
from txbroker.remoting.grpc import definition_pb2 as pb
from txbroker.remoting.grpc import service_pb2 as spb
from txbroker.remoting.grpc import service_pb2_grpc as rpc


async def heartbeat(channel: grpc.aio.Channel) -> spb.HeartbeatResponse:
    return await rpc.MessagingServiceStub(channel).Heartbeat(
        spb.HeartbeatRequest(), metadata=client_metadata(), timeout=5)


async def test_tls_only_with_the_brokers_certificate(tls_broker, pki) -> None:
    broker = await tls_broker(grpc_port=0)
    endpoint = f"127.0.0.1:{broker.grpc_port}"
    trust = grpc.ssl_channel_credentials(root_certificates=pki.ca_file.read_bytes())
    async with grpc.aio.secure_channel(endpoint, trust) as channel:
        assert (await heartbeat(channel)).status.code == pb.OK
        sent = await rpc.MessagingServiceStub(channel).SendMessage(
            spb.SendMessageRequest(messages=[message("GTls")]), metadata=client_metadata(),
            timeout=5)
        assert sent.status.code == pb.OK
    async with grpc.aio.insecure_channel(endpoint) as channel:
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await heartbeat(channel)
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE


async def test_client_certificates_required(tls_broker, pki) -> None:
    broker = await tls_broker(grpc_port=0, tls_ca=str(pki.ca_file), tls_client_auth="required")
    endpoint = f"127.0.0.1:{broker.grpc_port}"
    ca = pki.ca_file.read_bytes()
    cert, key = pki.issue_client("app")
    mutual = grpc.ssl_channel_credentials(root_certificates=ca,
                                          private_key=Path(key).read_bytes(),
                                          certificate_chain=Path(cert).read_bytes())
    async with grpc.aio.secure_channel(endpoint, mutual) as channel:
        assert (await heartbeat(channel)).status.code == pb.OK
    async with grpc.aio.secure_channel(endpoint, grpc.ssl_channel_credentials(ca)) as channel:
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await heartbeat(channel)
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE


async def test_a_renewed_certificate_reaches_new_connections(tls_broker, pki) -> None:
    """The files are replaced under a running broker (a new CA's certificate): the next
    handshake presents it, with no restart."""
    import trustme

    broker = await tls_broker(grpc_port=0)
    endpoint = f"127.0.0.1:{broker.grpc_port}"
    old_ca = pki.ca_file.read_bytes()
    new_ca = trustme.CA()
    pki.issue_server(pki.cert_file, pki.key_file, ca=new_ca)
    trust_new = grpc.ssl_channel_credentials(root_certificates=new_ca.cert_pem.bytes())
    async with grpc.aio.secure_channel(endpoint, trust_new) as channel:
        assert (await heartbeat(channel)).status.code == pb.OK
    async with grpc.aio.secure_channel(endpoint, grpc.ssl_channel_credentials(old_ca)) as channel:
        with pytest.raises(grpc.aio.AioRpcError):
            await heartbeat(channel)
