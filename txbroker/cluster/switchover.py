"""An operator's switch-over in etcd mode: the group's master hands over to a named in-sync
replica through the same path as a failover (docs/cluster.md, "Consensus on etcd").

The request is a ``switchover`` key naming the target, bound to a short lease of its own (a
request nobody carries out goes away).  The master, at its next renewal, fences itself and
only then deletes ``leader``; while the request stands only the target may be elected, and its
election transaction removes the request.  So the old master has stopped writing before the
new one can start: no two masters, unlike a controller that promotes at once while the old
master's lease still holds.
"""

from __future__ import annotations

import asyncio
import time

import orjson

from txbroker.cluster.etcd import Etcd, compare_create, compare_mod, put
from txbroker.cluster.leadership import GroupKeys, GroupState

#: How long a switch-over request stands (seconds, an etcd lease).
REQUEST_TTL = 30


class SwitchoverError(Exception):
    """The switch-over cannot be asked for, or did not happen in time: the message says why."""


async def switch_over(etcd: Etcd, keys: GroupKeys, target: int, timeout: float = 20.0) -> int:
    """Ask the group's master to hand over to ``target``; returns the new epoch once
    ``target`` holds ``leader``."""
    kvs, revision = await etcd.range(keys.base)
    group = GroupState.of(keys, kvs, revision)
    info = group.info()
    if info.master_id == target:
        raise SwitchoverError(f"id {target} is the master already (epoch {info.master_epoch})")
    if info.master_id is None:
        raise SwitchoverError("the group has no master now: an election is under way")
    if target not in group.isr_members:
        raise SwitchoverError(f"id {target} is not in the in-sync set {sorted(group.isr_members)}: "
                              f"it may lack acknowledged sends")
    if target not in group.replicas:
        raise SwitchoverError(f"id {target} is not alive (no etcd lease)")
    lease, _ = await etcd.grant(REQUEST_TTL)
    assert group.leader is not None and group.isr is not None
    result = await etcd.txn(
        [compare_create(keys.leader, group.leader.create_revision),
         compare_mod(keys.isr, group.isr.mod_revision)],
        [put(keys.switchover, orjson.dumps({"to": target}), lease)])
    if not result.succeeded:
        await etcd.revoke(lease)
        raise SwitchoverError("the group changed meanwhile (another election or in-sync set): "
                              "look again")
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        await asyncio.sleep(0.2)
        lead = await etcd.get(keys.leader)
        if lead is not None:
            doc = orjson.loads(lead.value)
            if int(doc["brokerId"]) == target:
                return int(doc["epoch"])
    await etcd.revoke(lease)
    raise SwitchoverError(f"id {target} did not become master within {timeout:g} s; the request "
                          f"was withdrawn")
