"""etcd mode with security on: the brokers reach etcd over TLS (verified against the
cluster's CA, presenting their certificate, as etcd's ``--client-cert-auth`` requires) and
with etcd's own authentication.  A real three-member etcd serving https (its members
started by :class:`~txbroker.cluster.local_etcd.LocalEtcd` with trustme's certificates)."""

from __future__ import annotations

from pathlib import Path

import pytest
from support.cluster import InProcessCluster
from support.waiting import eventually

from txbroker.cluster.etcd import Etcd, EtcdError, EtcdTLS, parse_endpoints
from txbroker.cluster.local_etcd import EtcdServerTLS, LocalEtcd
from txbroker.config import BrokerConfig
from txbroker.remoting.tls import ServerTLS

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("etcd")]


@pytest.fixture
def tls_etcd(tmp_path: Path, pki):
    cluster = LocalEtcd(tmp_path / "etcd", tls=EtcdServerTLS(str(pki.ca_file), str(pki.cert_file),
                                                             str(pki.key_file)))
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.stop()


async def test_brokers_elect_over_tls_with_etcd_authentication(
        broker_config: BrokerConfig, tmp_path: Path, pki, tls_etcd: LocalEtcd) -> None:
    """TLS with client certificates and etcd users: a master is elected and its slave
    follows; a client without a certificate, or with a wrong password, is refused in one
    line that names etcd."""
    tls_etcd.enable_auth("root-password")
    tls = {"tls_mode": "enforcing", "tls_cert": str(pki.cert_file), "tls_key": str(pki.key_file),
           "tls_ca": str(pki.ca_file), "tls_client_auth": "required"}
    server_tls = ServerTLS("enforcing", str(pki.cert_file), str(pki.key_file), str(pki.ca_file),
                           "required")
    base = broker_config.replace(**tls, metadata_sync_interval=0.2, broker_role="SYNC_MASTER")
    async with InProcessCluster(base, tmp_path) as c:
        await c.namesrv(tls=server_tls)
        common = {"etcd_endpoints": tls_etcd.endpoints, "etcd_lease": 2, "etcd_user": "root",
                  "etcd_password": "root-password"}
        a = await c.broker("broker-a", **common)
        b = await c.broker("broker-a", broker_id=1, **common)
        assert a.roles.is_master and a.roles.epoch == 1
        await eventually(lambda: a.roles.sync_state_set == {0, 1} and b.roles.ha_slave is not None
                         and b.roles.ha_slave.connected, timeout=20)
    endpoints = parse_endpoints(tls_etcd.endpoints)
    no_cert = Etcd(endpoints, timeout=1.0, tls=EtcdTLS(pki.ca_file.read_bytes()), user="root",
                   password="root-password")
    try:
        with pytest.raises(EtcdError, match="etcd"):
            await no_cert.get(b"/txbroker")
    finally:
        await no_cert.close()
    wrong = Etcd(endpoints, timeout=1.0,
                 tls=EtcdTLS.from_files(str(pki.ca_file), str(pki.cert_file), str(pki.key_file)),
                 user="root", password="wrong")
    try:
        with pytest.raises(EtcdError, match="authentication failed"):
            await wrong.get(b"/txbroker")
    finally:
        await wrong.close()


async def test_users_on_an_etcd_with_tls_and_authentication(
        broker_config: BrokerConfig, tmp_path: Path, pki, tls_etcd: LocalEtcd) -> None:
    """``txbroker user`` reaches the cluster's user store over TLS with etcd's own
    authentication (``--etcd-ca/--etcd-cert/--etcd-key``, ``--etcd-user`` and
    TXBROKER_ETCD_PASSWORD), and a broker reads it the same way; without the password the
    command is one line naming etcd."""
    from support.cli_runner import cli_ok, cli_one_line_error, run_cli

    from txbroker.cluster.user_keys import ClusterUsers

    tls_etcd.enable_auth("root-password")
    env = {"TXBROKER_ETCD_ENDPOINTS": tls_etcd.endpoints, "TXBROKER_ETCD_CA": str(pki.ca_file),
           "TXBROKER_ETCD_CERT": str(pki.cert_file), "TXBROKER_ETCD_KEY": str(pki.key_file),
           "TXBROKER_ETCD_USER": "root", "TXBROKER_ETCD_PASSWORD": "root-password"}
    out = cli_ok(await run_cli("user", "add", "alice", "--password-stdin", env=env,
                               input=b"alice-secret\n"))
    assert out == "user alice added\n"
    err = cli_one_line_error(await run_cli("user", "list",
                                           env={**env, "TXBROKER_ETCD_PASSWORD": "wrong"}))
    assert "etcd" in err
    config = broker_config.replace(
        namesrv_addr="127.0.0.1:9876", etcd_endpoints=tls_etcd.endpoints, tls_mode="enforcing",
        tls_cert=str(pki.cert_file), tls_key=str(pki.key_file), tls_ca=str(pki.ca_file),
        etcd_user="root", etcd_password="root-password")
    store = ClusterUsers(config)
    await store.start()
    try:
        assert store.check_password("alice", "alice-secret")
    finally:
        await store.close()
