"""Fault plans: a schedule of process and network faults replayed against an embedded cluster.

A plan is a YAML or JSON file (JSON is YAML) holding a list of faults, each due ``at`` seconds
after the replay starts::

    - {at: 20, action: kill-master, group: broker-a, restart_after: 10}
    - {at: 40, action: kill, target: broker-b-1, restart_after: 5}
    - {at: 60, action: pause, target: broker-b-0, for: 5}
    - {at: 90, action: partition, target: broker-a-master, for: 10}

Actions (:data:`ACTIONS`): ``kill-master`` SIGKILLs the group's master of that moment and starts
it again ``restart_after`` seconds later (omitted: it stays down); ``kill`` does the same to a
named process; ``pause`` SIGSTOPs a process and SIGCONTs it ``for`` seconds later;
``partition`` cuts a broker off (:meth:`EmbeddedCluster.partition`, proxies held) for ``for``
seconds.  A target is a process name (``controller``, ``namesrv``, ``broker-a-0``, ...) or
``<group>-master`` / ``<group>-slave``, resolved when the fault starts.

:func:`load_plan` checks the file on its own (shape, actions, times, fields) and
:func:`check_against` what depends on the cluster (its groups and processes, whether it can be
partitioned); both report every mistake, one line each, before anything runs.
:class:`FaultRunner` applies a plan on a thread from a given epoch and records what it did as
the rows of ``faults.json``: ``{"at_ms", "action", "target", "until_ms"}`` in epoch
milliseconds, the times the fault actually began and ended (``until_ms`` null when it never
ended: a process left down).  Steps run one after the other on that thread: a step due while
another is being applied (a restart takes a second or two) starts late, and the rows say so.
"""

from __future__ import annotations

import heapq
import json
import logging
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import yaml

from txbroker.bench.trace.tasks import now_ms

log = logging.getLogger("bench.faults")

#: Action -> (required fields, optional fields) besides ``at`` and ``action``.
ACTIONS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "kill-master": (("group",), ("restart_after",)),
    "kill": (("target",), ("restart_after",)),
    "pause": (("target", "for"), ()),
    "partition": (("target", "for"), ()),
}
#: Roles a target may name instead of a broker: ``<group>-master``, ``<group>-slave``.
ROLES = ("master", "slave")
SERVICES = ("controller", "namesrv")


class FaultPlanError(ValueError):
    """A plan cannot run; ``str()`` is one line per mistake, each naming the file and fault."""

    def __init__(self, lines: list[str]) -> None:
        super().__init__("\n".join(lines))
        self.lines = lines


@dataclass(frozen=True)
class Fault:
    at: float
    action: str
    #: The group (kill-master) or the target as written (other actions).
    target: str
    #: ``restart_after`` (kill, kill-master; None: stays down) or ``for`` (pause, partition).
    duration: float | None

    def __str__(self) -> str:
        return f"{self.action} {self.target} at {self.at:g} s"


class Cluster(Protocol):
    """What a plan needs of a cluster (:class:`~txbroker.bench.trace.cluster.EmbeddedCluster`)."""

    group_names: list[str]
    partitionable: bool

    def processes(self) -> dict: ...
    def resolve(self, target: str) -> str: ...
    def kill(self, name: str) -> None: ...
    def restart(self, name: str) -> None: ...
    def pause(self, name: str) -> None: ...
    def resume(self, name: str) -> None: ...
    def partition(self, name: str) -> None: ...
    def heal(self, name: str) -> None: ...


def _seconds(value: object) -> float | None:
    """A finite number >= 0 (bool is not a number here), else None."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    value = float(value)
    return value if 0 <= value < float("inf") else None


def parse_plan(doc: object, source: str) -> list[Fault]:
    """The faults of a loaded document, sorted by ``at``; FaultPlanError lists every mistake."""
    if not isinstance(doc, list):
        raise FaultPlanError([f"{source}: a fault plan is a list of faults, got {type(doc).__name__}"])
    errors: list[str] = []
    faults: list[Fault] = []
    for n, entry in enumerate(doc, 1):
        where = f"{source}: fault {n}"
        if not isinstance(entry, dict):
            errors.append(f"{where}: expected a mapping like {{at: 20, action: kill-master, group: broker-a}}")
            continue
        action = entry.get("action")
        if action not in ACTIONS:
            errors.append(f"{where}: unknown action {action!r}; choose from {', '.join(ACTIONS)}")
            continue
        at = _seconds(entry.get("at"))
        if at is None:
            errors.append(f"{where} ({action}): at={entry.get('at')!r}: expected seconds >= 0 "
                          "from the replay start")
        required, optional = ACTIONS[action]
        for key in sorted(set(entry) - {"at", "action", *required, *optional}):
            errors.append(f"{where} ({action}): unknown field {key!r}; {action} takes "
                          f"{', '.join(('at', *required, *optional))}")
        missing = [k for k in required if k not in entry]
        for key in missing:
            errors.append(f"{where} ({action}): {key!r} is missing")
        name_key = required[0]
        name = entry.get(name_key)
        if name_key not in missing and (not isinstance(name, str) or not name):
            errors.append(f"{where} ({action}): {name_key}={name!r}: expected a name")
        span_key = "for" if "for" in required else "restart_after"
        duration = None
        if span_key in entry:
            duration = _seconds(entry[span_key])
            if duration is None or (span_key == "for" and duration == 0):
                bound = "> 0" if span_key == "for" else ">= 0"
                errors.append(f"{where} ({action}): {span_key}={entry[span_key]!r}: expected seconds {bound}")
        if at is not None and isinstance(name, str) and name:
            faults.append(Fault(at, action, name, duration))
    if errors:
        raise FaultPlanError(errors)
    return sorted(faults, key=lambda f: f.at)


def load_plan(path: str | Path) -> list[Fault]:
    """Read and check a plan file (YAML or JSON)."""
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise FaultPlanError([f"{path}: cannot read the fault plan: {exc.strerror or exc}"]) from None
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f" (line {mark.line + 1})" if mark is not None else ""
        raise FaultPlanError([f"{path}: not YAML or JSON{at}: {getattr(exc, 'problem', None) or exc}"]) from None
    return parse_plan(doc, str(path))


def check_against(faults: list[Fault], cluster: Cluster, source: str = "fault plan") -> None:
    """Every fault names what ``cluster`` has (raises FaultPlanError listing the rest)."""
    groups = list(cluster.group_names)
    names = set(cluster.processes())
    brokers = names - set(SERVICES)
    errors = []
    for n, f in enumerate(faults, 1):
        where = f"{source}: fault {n} ({f})"
        group, _, role = f.target.rpartition("-")
        by_role = role in ROLES and group in groups
        if f.action == "kill-master":
            if f.target not in groups:
                errors.append(f"{where}: the cluster has no group {f.target!r}; it has {', '.join(groups)}")
        elif f.action == "partition" and not (by_role or f.target in brokers):
            errors.append(f"{where}: {f.target!r} is not a broker of the cluster; name one of "
                          f"{', '.join(sorted(brokers))} or <group>-master / <group>-slave")
        elif not (by_role or f.target in names):
            errors.append(f"{where}: the cluster has no process {f.target!r}; name one of "
                          f"{', '.join([*SERVICES, *sorted(brokers)])} or <group>-master / <group>-slave")
        if f.action == "partition" and not cluster.partitionable:
            errors.append(f"{where}: partitions need the cluster started behind proxies (partitionable)")
    if errors:
        raise FaultPlanError(errors)


def needs_proxies(faults: list[Fault]) -> bool:
    """Whether the cluster must be started ``partitionable`` for this plan."""
    return any(f.action == "partition" for f in faults)



class FaultRunner:
    """Applies ``faults`` to ``cluster`` on a thread, ``at`` seconds after ``epoch_ms``."""

    def __init__(self, faults: list[Fault], cluster: Cluster, epoch_ms: float) -> None:
        check_against(faults, cluster)
        self.faults = faults
        self.cluster = cluster
        self.epoch_ms = epoch_ms
        #: faults.json rows, in the order the faults began.
        self.events: list[dict] = []
        #: Faults that could not be applied (no master at that moment, a process that would
        #: not restart), one line each.
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="fault-plan", daemon=True)
        #: (due ms, seq, what, row) of the ends still to come.
        self._ends: list[tuple[float, int, str, dict]] = []

    def start(self) -> FaultRunner:
        self._thread.start()
        return self

    def stop(self, timeout: float = 120.0) -> list[dict]:
        """End the plan: faults not yet begun are dropped, faults in effect are ended now (a
        paused process resumed, a partition healed, a process waiting for its restart
        started).  Returns the rows."""
        self._stop.set()
        self._thread.join(timeout)
        return self.events

    def write(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.events, indent=1) + "\n")

    # --- the thread -------------------------------------------------------------------------
    def _run(self) -> None:
        starts = [(self.epoch_ms + f.at * 1000.0, n, f) for n, f in enumerate(self.faults)]
        seq = len(starts)
        while starts or self._ends:
            due_start = starts[0][0] if starts else float("inf")
            due_end = self._ends[0][0] if self._ends else float("inf")
            due = min(due_start, due_end)
            if self._stop.wait(max(0.0, (due - now_ms()) / 1000.0)):
                break
            if due_end <= due_start:
                _, _, name, row = heapq.heappop(self._ends)
                self._end(name, row)
            else:
                _, _, fault = starts.pop(0)
                end = self._begin(fault)
                if end is not None:
                    heapq.heappush(self._ends, (end[0], seq, end[1], end[2]))
                    seq += 1
        while self._ends:  # stopped early: end what is in effect
            _, _, name, row = heapq.heappop(self._ends)
            self._end(name, row)

    def _begin(self, fault: Fault) -> tuple[float, str, dict] | None:
        """Apply the start of ``fault``; returns (due ms, process, row) of its end, if any."""
        try:
            name = self.cluster.resolve(fault.target + "-master" if fault.action == "kill-master"
                                        else fault.target)
            row = {"at_ms": round(now_ms()), "action": fault.action, "target": name, "until_ms": None}
            if fault.action in ("kill", "kill-master"):
                self.cluster.kill(name)
            elif fault.action == "pause":
                self.cluster.pause(name)
            else:
                self.cluster.partition(name)
        except Exception as exc:  # noqa: BLE001 - recorded and the plan goes on
            self._failed(fault, exc)
            return None
        self.events.append(row)
        log.info("fault: %s %s", fault.action, name)
        if fault.duration is None:
            return None
        return row["at_ms"] + fault.duration * 1000.0, name, row

    def _end(self, name: str, row: dict) -> None:
        try:
            if row["action"] in ("kill", "kill-master"):
                self.cluster.restart(name)
            elif row["action"] == "pause":
                self.cluster.resume(name)
            else:
                self.cluster.heal(name)
        except Exception as exc:  # noqa: BLE001 - recorded; the row keeps until_ms null
            self.errors.append(f"{row['action']} {name}: could not end it: {str(exc).splitlines()[0]}")
            log.warning("fault: %s", self.errors[-1])
            return
        row["until_ms"] = round(now_ms())
        log.info("fault ended: %s %s", row["action"], name)

    def _failed(self, fault: Fault, exc: Exception) -> None:
        self.errors.append(f"{fault}: not applied: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}")
        log.warning("fault: %s", self.errors[-1])
