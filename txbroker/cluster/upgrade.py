"""Moving a cluster from a controller to etcd: the controller's groups, imported once.

A group's master epoch and in-sync set are what make the next election safe: only a member of
the set holds every acknowledged send, and a new epoch must be above every epoch any log
holds.  A cluster that ran under ``txbroker controller`` has them in ``controller.json``;
``txbroker etcd-import`` writes each group's ``epoch`` and ``isr`` keys from it (docs/cluster.md,
"Consensus on etcd"), only where the group has no keys in etcd yet, so running it twice changes
nothing.  Without the import, a broker configured as id 0 whose log already holds an epoch
above the classic one refuses to start the group's first election in etcd, with one line
saying to import (:meth:`txbroker.cluster.leadership.EtcdLeadership._eligible`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson

from txbroker.cluster.etcd import Etcd, compare_create, put
from txbroker.cluster.leadership import GroupKeys
from txbroker.cluster.replicas import ReplicasInfo

#: The controller's state file in its data directory.
STATE_FILE = "controller.json"


def read_controller_state(data_dir: str | Path) -> dict[str, Any]:
    """``controller.json`` of a controller's data directory, checked as the controller
    checks it at start (ValueError naming what is wrong, FileNotFoundError when absent)."""
    path = Path(data_dir) / STATE_FILE
    doc = orjson.loads(path.read_bytes())
    ReplicasInfo.from_json(doc)  # validates: raises ValueError naming the problem
    return doc


async def import_groups(etcd: Etcd, prefix: str, doc: dict[str, Any]) -> list[str]:
    """Write each group's ``epoch`` and ``isr`` where etcd has none; one line per group."""
    lines = []
    for group in doc["groups"]:
        cluster, name = str(group["clusterName"]), str(group["brokerName"])
        keys = GroupKeys.named(prefix, cluster, name)
        epoch = int(group["masterEpoch"])
        members = sorted(int(m) for m in group["syncStateSet"])
        isr = {"members": members, "epoch": int(group["syncStateSetEpoch"]), "masterEpoch": epoch}
        result = await etcd.txn(
            [compare_create(keys.epoch, 0), compare_create(keys.isr, 0),
             compare_create(keys.leader, 0)],
            [put(keys.epoch, orjson.dumps({"epoch": epoch})), put(keys.isr, orjson.dumps(isr))])
        if result.succeeded:
            lines.append(f"group {name} ({cluster}): imported, epoch {epoch}, in sync {members}")
        else:
            lines.append(f"group {name} ({cluster}): already in etcd, unchanged")
    return lines
