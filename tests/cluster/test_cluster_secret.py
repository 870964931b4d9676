"""The cluster secret on the controller link (a real ControllerProcess and the broker's real
ControllerLink over TCP), a classic master/slave pair of in-process brokers under ACL and a
cluster secret, and the secret kept out of logs, ``--print-config`` and the status document."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from click.testing import CliRunner
from support.cluster import InProcessCluster
from support.waiting import eventually

from txbroker.cli.main import main as cli
from txbroker.cluster.controller_link import (
    ControllerError,
    ControllerLink,
    MasterInfo,
    ReplicaState,
)
from txbroker.config import BrokerConfig, ConfigError
from txbroker.controller import ControllerConfig, ControllerProcess
from txbroker.remoting.client import RemotingClient
from txbroker.remoting.codes import RequestCode, ResponseCode
from txbroker.remoting.command import RemotingCommand
from txbroker.remoting.controller_headers import (
    AlterSyncStateSetRequestHeader,
    ElectMasterRequestHeader,
    NotifyBrokerRoleChangedRequestHeader,
    RegisterBrokerToControllerRequestHeader,
    encode_sync_state_set,
)
from txbroker.service.cluster_auth import sign_request
from txbroker.service.topics import TopicConfig

SECRET = "cluster-secret-1"
ACL = """\
accounts:
  - accessKey: broker-key
    secretKey: broker-secret
    admin: true
  - accessKey: reader-key
    secretKey: reader-secret
    defaultTopicPerm: SUB
"""


async def _controller(tmp_path: Path, secret: str | None) -> ControllerProcess:
    ctl = ControllerProcess(ControllerConfig(listen_host="127.0.0.1", port=0, lease=5.0,
                                             data_dir=str(tmp_path / "ctl"), cluster_secret=secret))
    await ctl.start()
    return ctl


def _link(ctl: ControllerProcess, secret: str | None, learned: list[MasterInfo]) -> ControllerLink:
    config = BrokerConfig(controller_addr=ctl.addr, cluster_secret=secret, broker_id=0)

    async def on_master(info: MasterInfo) -> None:
        learned.append(info)

    return ControllerLink(config, broker_addr="127.0.0.1:10911", ha_addr="127.0.0.1:10912",
                          state=ReplicaState, on_master=on_master)


async def _raw(ctl: ControllerProcess, code: int, ext: dict[str, str], body: bytes = b"",
               secret: str | None = None) -> RemotingCommand:
    client = RemotingClient(ctl.addr)
    try:
        cmd = RemotingCommand.request(code, ext, body)
        if secret is not None:
            sign_request(cmd, secret)
        return await client.invoke(cmd, 3.0)
    finally:
        await client.close()


async def test_signed_link_registers_elects_and_heartbeats(tmp_path):
    ctl = await _controller(tmp_path, SECRET)
    learned: list[MasterInfo] = []
    link = _link(ctl, SECRET, learned)
    try:
        await link.register()
        info = await link.elect()
        assert info.master_id == 0 and info.master_epoch == 1
        assert (await link.heartbeat()).master_id == 0
        assert ctl.guard.refused == 0
    finally:
        await link.close()
        await ctl.stop()


async def test_controller_refuses_unsigned_and_forged_requests(tmp_path, caplog):
    ctl = await _controller(tmp_path, SECRET)
    try:
        register = RegisterBrokerToControllerRequestHeader(
            cluster_name="DefaultCluster", broker_name="broker-a", broker_id=0,
            broker_address="127.0.0.1:10911", ha_server_addr="127.0.0.1:10912").to_ext()
        elect = ElectMasterRequestHeader(cluster_name="DefaultCluster", broker_name="broker-a",
                                         broker_id=7).to_ext()
        alter = AlterSyncStateSetRequestHeader(broker_name="broker-a", master_broker_id=0,
                                               master_epoch=1).to_ext()
        for code, ext, body in ((RequestCode.CONTROLLER_REGISTER_BROKER, register, b""),
                                (RequestCode.CONTROLLER_ELECT_MASTER, elect, b""),
                                (RequestCode.CONTROLLER_ALTER_SYNC_STATE_SET, alter,
                                 encode_sync_state_set({0, 7}, 1))):
            resp = await _raw(ctl, code, ext, body)
            assert resp.code == ResponseCode.NO_PERMISSION, (code, resp.remark)
            assert "not signed" in resp.remark
            resp = await _raw(ctl, code, ext, body, secret="guessed-secret")
            assert resp.code == ResponseCode.NO_PERMISSION
            assert "does not match" in resp.remark
        assert ctl.state.groups() == []  # nothing of it happened
        refusals = [r for r in caplog.records if "refused request code" in r.getMessage()
                    and r.levelno >= logging.WARNING]
        assert len(refusals) == 2 and "127.0.0.1:" in refusals[0].getMessage()  # once per cause
        # The signed request goes through.
        resp = await _raw(ctl, RequestCode.CONTROLLER_REGISTER_BROKER, register, secret=SECRET)
        assert resp.code == ResponseCode.SUCCESS
    finally:
        await ctl.stop()


@pytest.mark.parametrize("controller_secret, broker_secret, says",
                         [(SECRET, None, "not signed"), (None, SECRET, "none is set here")])
async def test_a_secret_on_one_end_only_is_a_clear_error_on_each(tmp_path, caplog, controller_secret,
                                                                broker_secret, says):
    ctl = await _controller(tmp_path, controller_secret)
    link = _link(ctl, broker_secret, [])
    try:
        for _ in range(3):
            with pytest.raises(ControllerError) as info:
                await link.register()
            assert info.value.code == ResponseCode.NO_PERMISSION and says in str(info.value)
            assert ctl.addr in str(info.value)
        said = [r.getMessage() for r in caplog.records if r.name == "txbroker.service.cluster_auth"
                and r.levelno >= logging.WARNING]
        assert len(said) == 1 and says in said[0] and "cluster_secret" in said[0]
    finally:
        await link.close()
        await ctl.stop()


async def test_unsigned_role_change_notice_is_not_trusted(tmp_path, caplog):
    ctl = await _controller(tmp_path, SECRET)
    learned: list[MasterInfo] = []
    link = _link(ctl, SECRET, learned)
    try:
        await link.register()
        await link.elect()
        before = link.master
        forged = NotifyBrokerRoleChangedRequestHeader(
            master_broker_id=9, master_address="10.0.0.9:10911", master_epoch=99,
            sync_state_set_epoch=1).to_ext()
        notice = RemotingCommand.request(RequestCode.NOTIFY_BROKER_ROLE_CHANGED, forged,
                                         encode_sync_state_set({9}, 1), oneway=True)
        await link._notified(notice)  # what the client runs when a notice arrives
        assert link.master == before and all(i.master_id != 9 for i in learned)
        assert any("ignored a role-change notice" in r.getMessage() and "not signed" in r.getMessage()
                   for r in caplog.records)
        sign_request(notice, SECRET)  # the same notice from the controller is followed
        await link._notified(notice)
        assert link.master is not None and link.master.master_id == 9
        # ... once: the same notice again (recorded on the path and replayed) is ignored.
        caplog.clear()
        await link._notified(notice)
        assert any("ignored a role-change notice" in r.getMessage() and "nonce" in r.getMessage()
                   for r in caplog.records)
    finally:
        await link.close()
        await ctl.stop()


async def test_slave_syncs_metadata_and_replicates_under_acl_and_a_cluster_secret(
        broker_config: BrokerConfig, tmp_path: Path, caplog) -> None:
    acl = tmp_path / "plain_acl.yml"
    acl.write_text(ACL)
    base = broker_config.replace(metadata_sync_interval=0.2, acl_file=str(acl),
                                 acl_access_key="broker-key", cluster_secret=SECRET)
    async with InProcessCluster(base, tmp_path) as c:
        await c.namesrv()
        master = await c.broker("broker-a")
        slave = await c.broker("broker-a", broker_id=1)
        await master.topics.create_or_update(TopicConfig("Synced", 2, 2))
        # An offset is a replicated record (store/offset_log.py), under the secret like all.
        assert master.store.commit_offsets_now([("cg", "Synced", 1, 42, None)]).ok
        await eventually(lambda: slave.topics.get("Synced") is not None, timeout=10,
                         msg=lambda: f"slave sync problem: {slave.roles.sync.problem}")
        await eventually(lambda: slave.store.offsets.get("cg", "Synced", 1) == 42, timeout=10)
        await eventually(lambda: slave.store.max_physical_offset == master.store.max_physical_offset)
        assert "replicationError" not in slave.roles.status()
        assert SECRET not in caplog.text and SECRET not in str(slave.roles.status())
        assert SECRET not in repr(slave.config)


async def test_slave_without_an_account_says_why_once_and_in_its_status(
        broker_config: BrokerConfig, tmp_path: Path, caplog) -> None:
    acl = tmp_path / "plain_acl.yml"
    acl.write_text(ACL)
    base = broker_config.replace(metadata_sync_interval=0.1, acl_file=str(acl))
    async with InProcessCluster(base, tmp_path) as c:
        await c.namesrv()
        await c.broker("broker-a")
        slave = await c.broker("broker-a", broker_id=1)
        await eventually(lambda: "replicationError" in slave.roles.status())
        await eventually(lambda: slave.roles.sync.problem is not None)
        assert "AccessKey" in slave.roles.sync.problem
        rounds = [r for r in caplog.records if "metadata sync from the master failed" in r.getMessage()]
        assert len(rounds) == 1


async def test_acl_access_key_must_name_an_account(broker_config: BrokerConfig, tmp_path: Path) -> None:
    acl = tmp_path / "plain_acl.yml"
    acl.write_text(ACL)
    with pytest.raises(ConfigError, match="acl_access_key"):
        broker_config.replace(acl_access_key="broker-key")  # without acl_file
    base = broker_config.replace(acl_file=str(acl), acl_access_key="nobody-key")
    async with InProcessCluster(base, tmp_path) as c:
        await c.namesrv()
        with pytest.raises(ConfigError, match="nobody-key"):
            await c.broker("broker-a")


def test_secret_never_printed_or_logged(tmp_path: Path) -> None:
    runner = CliRunner()
    out = runner.invoke(cli, ["serve", "--print-config", "--data-dir", str(tmp_path)],
                        env={"TXBROKER_CLUSTER_SECRET": SECRET})
    assert out.exit_code == 0, out.output
    assert SECRET not in out.output and "cluster_secret is set (not printed)" in out.output
    short = runner.invoke(cli, ["serve", "--print-config", "--cluster-secret", "short"])
    assert short.exit_code == 2 and "at least 8 characters" in short.output
    assert "short" not in short.output.replace("at least", "")
    assert SECRET not in repr(BrokerConfig(cluster_secret=SECRET))
    assert SECRET not in str(BrokerConfig(cluster_secret=SECRET).as_dict())
    assert SECRET not in repr(ControllerConfig(cluster_secret=SECRET))


def test_controller_command_takes_the_secret(tmp_path: Path) -> None:
    runner = CliRunner()
    helped = runner.invoke(cli, ["controller", "--help"])
    assert "--cluster-secret" in helped.output
    short = runner.invoke(cli, ["controller", "--port", "0", "--data-dir", str(tmp_path)],
                          env={"TXBROKER_CLUSTER_SECRET": "short"})
    assert short.exit_code == 2 and "at least 8 characters" in short.output
    assert not (tmp_path / "controller.json").exists()
