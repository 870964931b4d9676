"""Fault plans on their own: the file's shape, every kind of mistake (one line each, naming the
file and the fault) and what depends on the cluster (checked against a real, unstarted
:class:`EmbeddedCluster`: its names are what the plan must match)."""

from __future__ import annotations

import json

import pytest

from txbroker.bench.trace.cluster import ClusterError, EmbeddedCluster
from txbroker.bench.trace.faultplan import (
    Fault,
    FaultPlanError,
    check_against,
    load_plan,
    needs_proxies,
)

EXAMPLE = [{"at": 20, "action": "kill-master", "group": "broker-a", "restart_after": 10},
           {"at": 90, "action": "partition", "target": "broker-a-master", "for": 10},
           {"at": 60, "action": "pause", "target": "broker-b-0", "for": 5},
           {"at": 5.5, "action": "kill", "target": "namesrv"}]


@pytest.fixture
def cluster(tmp_path):
    c = EmbeddedCluster(2, {"transaction_check_max": 2}, root=tmp_path / "cluster")
    yield c
    c.close()


def plan_file(tmp_path, doc, name="plan.json"):
    path = tmp_path / name
    path.write_text(doc if isinstance(doc, str) else json.dumps(doc))
    return path


def errors_of(fn, *args) -> list[str]:
    with pytest.raises(FaultPlanError) as info:
        fn(*args)
    assert str(info.value) == "\n".join(info.value.lines)
    return info.value.lines


def test_example_plan_reads_from_json_and_yaml_sorted_by_time(tmp_path, cluster):
    faults = load_plan(plan_file(tmp_path, EXAMPLE))
    assert [f.at for f in faults] == [5.5, 20, 60, 90]
    assert faults[1] == Fault(20, "kill-master", "broker-a", 10)
    assert faults[0] == Fault(5.5, "kill", "namesrv", None)  # no restart: stays down
    yaml_text = ("- {at: 20, action: kill-master, group: broker-a, restart_after: 10}\n"
                 "- at: 60\n  action: pause\n  target: broker-b-0\n  for: 5\n")
    assert load_plan(plan_file(tmp_path, yaml_text, "plan.yaml")) == [faults[1], faults[2]]
    assert needs_proxies(faults) and not needs_proxies(faults[:3])
    check_against(faults[:3], cluster)  # no partition: fine without proxies


def test_each_mistake_in_a_file_is_one_line_naming_file_and_fault(tmp_path):
    path = plan_file(tmp_path, [
        {"at": 1, "action": "explode", "target": "broker-a-0"},
        {"at": -3, "action": "pause", "target": "broker-a-0", "for": 2},
        {"at": "soon", "action": "kill", "target": "broker-a-0"},
        {"at": 1, "action": "pause", "target": "broker-a-0"},
        {"at": 1, "action": "partition", "target": "broker-a-0", "for": 0},
        {"at": 1, "action": "kill-master", "group": "broker-a", "restart_after": True},
        {"at": 1, "action": "kill", "target": "broker-a-0", "duration": 3},
        {"at": 1, "action": "kill-master", "group": ""},
        "kill broker-a-0",
    ])
    lines = errors_of(load_plan, path)
    assert lines == [
        f"{path}: fault 1: unknown action 'explode'; choose from kill-master, kill, pause, partition",
        f"{path}: fault 2 (pause): at=-3: expected seconds >= 0 from the replay start",
        f"{path}: fault 3 (kill): at='soon': expected seconds >= 0 from the replay start",
        f"{path}: fault 4 (pause): 'for' is missing",
        f"{path}: fault 5 (partition): for=0: expected seconds > 0",
        f"{path}: fault 6 (kill-master): restart_after=True: expected seconds >= 0",
        f"{path}: fault 7 (kill): unknown field 'duration'; kill takes at, target, restart_after",
        f"{path}: fault 8 (kill-master): group='': expected a name",
        f"{path}: fault 9: expected a mapping like {{at: 20, action: kill-master, group: broker-a}}",
    ]


def test_a_file_that_is_not_a_plan_is_one_line(tmp_path):
    assert errors_of(load_plan, plan_file(tmp_path, {"at": 1})) == [
        f"{tmp_path / 'plan.json'}: a fault plan is a list of faults, got dict"]
    bad = plan_file(tmp_path, "- {at: 1, action: kill\n", "bad.yaml")
    (line,) = errors_of(load_plan, bad)
    assert line.startswith(f"{bad}: not YAML or JSON (line ")
    (line,) = errors_of(load_plan, tmp_path / "missing.json")
    assert line == f"{tmp_path / 'missing.json'}: cannot read the fault plan: No such file or directory"


def test_names_the_cluster_does_not_have_are_one_line_each(tmp_path, cluster):
    faults = load_plan(plan_file(tmp_path, [
        {"at": 1, "action": "kill-master", "group": "broker-c", "restart_after": 1},
        {"at": 2, "action": "kill", "target": "broker-c-0"},
        {"at": 3, "action": "pause", "target": "broker-b-master", "for": 1},  # fine
        {"at": 4, "action": "partition", "target": "namesrv", "for": 1},
        {"at": 5, "action": "partition", "target": "broker-a-1", "for": 1},
    ]))
    lines = errors_of(check_against, faults, cluster, "plan.json")
    brokers = "broker-a-0, broker-a-1, broker-b-0, broker-b-1"
    roles = "<group>-master / <group>-slave"
    proxies = "partitions need the cluster started behind proxies (partitionable)"
    assert lines == [
        "plan.json: fault 1 (kill-master broker-c at 1 s): the cluster has no group 'broker-c'; it has broker-a, broker-b",
        f"plan.json: fault 2 (kill broker-c-0 at 2 s): the cluster has no process 'broker-c-0'; name one of controller, namesrv, {brokers} or {roles}",
        f"plan.json: fault 4 (partition namesrv at 4 s): 'namesrv' is not a broker of the cluster; name one of {brokers} or {roles}",
        f"plan.json: fault 4 (partition namesrv at 4 s): {proxies}",
        f"plan.json: fault 5 (partition broker-a-1 at 5 s): {proxies}",
    ]


def test_a_cluster_size_out_of_range_is_one_line(tmp_path):
    for groups in (0, 27):
        with pytest.raises(ClusterError) as info:
            EmbeddedCluster(groups, root=tmp_path)
        assert str(info.value) == f"--cluster {groups}: a cluster has 1 to 26 broker groups"
