"""The headers and the SyncStateSet body of the controller requests (RocketMQ 5.x controller
mode, ``org.apache.rocketmq.remoting.protocol.header.controller``; docs/cluster.md "Controller
and failover" lists every field).

Field names are RocketMQ's.  Our extensions, all optional on the wire so a RocketMQ peer that
does not send them is still understood: ``haServerAddr`` on registration (the controller
hands the master's HA address to the slaves), ``masterHaAddress`` wherever the master is
named, and the master fields on a successful heartbeat's answer (a broker learns a role
change from its next heartbeat even if NOTIFY_BROKER_ROLE_CHANGED was lost).
"""

from __future__ import annotations

from collections.abc import Iterable

import orjson

from txbroker.remoting.codes import ResponseCode
from txbroker.remoting.header_codec import (
    Header,
    HeaderError,
    h_bool,
    h_int,
    h_long,
    h_str,
    wire_header,
)


@wire_header
class MasterInfoHeader(Header):
    """The group's master as every controller answer names it; absent fields = no master."""

    master_broker_id: int | None = h_long("masterBrokerId", None)
    master_address: str | None = h_str("masterAddress", None)
    master_ha_address: str | None = h_str("masterHaAddress", None)
    master_epoch: int = h_int("masterEpoch", 0, lo=0)
    sync_state_set_epoch: int = h_int("syncStateSetEpoch", 0, lo=0)


@wire_header
class RegisterBrokerToControllerRequestHeader(Header):
    """CONTROLLER_REGISTER_BROKER (1003)."""

    cluster_name: str = h_str("clusterName")
    broker_name: str = h_str("brokerName")
    broker_id: int = h_long("brokerId", lo=0)
    broker_address: str = h_str("brokerAddress")
    #: Extension: where this broker's HA listener is, for its slaves when it becomes master.
    ha_server_addr: str = h_str("haServerAddr", "")
    invoke_time: int = h_long("invokeTime", 0)


@wire_header
class RegisterBrokerToControllerResponseHeader(MasterInfoHeader):
    pass


@wire_header
class BrokerHeartbeatRequestHeader(Header):
    """BROKER_HEARTBEAT (904); ``epoch`` is the last master epoch the broker follows or leads."""

    cluster_name: str = h_str("clusterName")
    broker_addr: str = h_str("brokerAddr")
    broker_name: str = h_str("brokerName")
    broker_id: int = h_long("brokerId", lo=0)
    epoch: int = h_int("epoch", 0, lo=0)
    max_offset: int = h_long("maxOffset", 0, lo=0)
    confirm_offset: int = h_long("confirmOffset", 0, lo=0)
    heartbeat_timeout_mills: int | None = h_long("heartbeatTimeoutMills", None, lo=1)
    election_priority: int | None = h_int("electionPriority", None)


@wire_header
class BrokerHeartbeatResponseHeader(MasterInfoHeader):
    """Extension: RocketMQ answers a heartbeat with no header."""


@wire_header
class ElectMasterRequestHeader(Header):
    """CONTROLLER_ELECT_MASTER (1002)."""

    cluster_name: str = h_str("clusterName", "")
    broker_name: str = h_str("brokerName")
    broker_id: int = h_long("brokerId", lo=0)
    designate_elect: bool = h_bool("designateElect", False)
    invoke_time: int = h_long("invokeTime", 0)


@wire_header
class ElectMasterResponseHeader(MasterInfoHeader):
    pass


@wire_header
class AlterSyncStateSetRequestHeader(Header):
    """CONTROLLER_ALTER_SYNC_STATE_SET (1001); the body is the new SyncStateSet."""

    broker_name: str = h_str("brokerName")
    master_broker_id: int = h_long("masterBrokerId", lo=0)
    master_epoch: int = h_int("masterEpoch", lo=0)
    invoke_time: int = h_long("invokeTime", 0)


@wire_header
class AlterSyncStateSetResponseHeader(Header):
    new_sync_state_set_epoch: int = h_int("newSyncStateSetEpoch", lo=0)


@wire_header
class GetReplicaInfoRequestHeader(Header):
    """CONTROLLER_GET_REPLICA_INFO (1004)."""

    broker_name: str = h_str("brokerName")


@wire_header
class GetReplicaInfoResponseHeader(MasterInfoHeader):
    pass


@wire_header
class NotifyBrokerRoleChangedRequestHeader(MasterInfoHeader):
    """NOTIFY_BROKER_ROLE_CHANGED (1008), controller -> broker, one-way; body SyncStateSet."""


# --- SyncStateSet body -------------------------------------------------------------------------


def encode_sync_state_set(members: Iterable[int], epoch: int) -> bytes:
    """RocketMQ's SyncStateSet body: ``{"syncStateSet":[ids],"syncStateSetEpoch":n}``."""
    return orjson.dumps({"syncStateSet": sorted(members), "syncStateSetEpoch": epoch})


def decode_sync_state_set(body: bytes) -> tuple[frozenset[int], int]:
    """(members, epoch) from a SyncStateSet body; HeaderError (SYSTEM_ERROR) naming the
    problem when it is not one."""
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise HeaderError(ResponseCode.SYSTEM_ERROR, f"SyncStateSet body is not JSON: {exc}") from None
    members = doc.get("syncStateSet") if isinstance(doc, dict) else None
    epoch = doc.get("syncStateSetEpoch") if isinstance(doc, dict) else None
    if not isinstance(members, list) or not all(
            isinstance(m, int) and not isinstance(m, bool) and m >= 0 for m in members):
        raise HeaderError(ResponseCode.SYSTEM_ERROR,
                          "SyncStateSet body needs 'syncStateSet': a list of broker ids >= 0")
    if not isinstance(epoch, int) or isinstance(epoch, bool) or epoch < 0:
        raise HeaderError(ResponseCode.SYSTEM_ERROR,
                          "SyncStateSet body needs 'syncStateSetEpoch': an integer >= 0")
    return frozenset(members), epoch
