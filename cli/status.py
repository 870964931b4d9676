"""``txbroker status``: topics with queue offsets, consumer groups, pending halves, metrics.

Every broker the name server lists is shown, masters and slaves, each named as in the logs
(``name@address``) with its role and master epoch; a group whose brokers report their roles
gets a line with its master, epoch and in-sync replicas; a member the name servers dropped
(killed, stopped, silent) is listed as ``down since HH:MM:SS (N s ago: why)`` until it
registers again; then, when there is more than one broker, the cluster's totals.
"""

from __future__ import annotations

import time
from datetime import datetime

import click
import orjson
from rich.console import Console
from rich.table import Table

from txbroker.cli.common import (
    credentials_options,
    is_system_topic,
    namesrv_option,
    run,
)
from txbroker.client.admin import AdminClient
from txbroker.workers import split_worker_name

#: Metrics worth a glance; the full table is in --json.
KEY_METRICS = ("commitLogMaxOffset", "pendingHalfMessages", "connections", "heldPulls",
               "flushMode", "brokerVersionDesc")
WORKER_METRICS = KEY_METRICS[:4]


@click.command()
@click.option("--json", "as_json", is_flag=True, help="Print the full status documents as JSON.")
@click.option("--system", is_flag=True, help="Include system topics (RMQ_SYS_*, %RETRY%, ...).")
@click.option("--wait", "wait_s", type=click.FloatRange(min=0), default=0, show_default=True,
              help="Seconds to wait, asking again every second, until every broker group has "
                   "a master (a failover in progress); what is shown then says which has none.")
@namesrv_option
@credentials_options
def status(as_json: bool, system: bool, wait_s: float, namesrv: str,
           credentials: dict[str, str]) -> None:
    """Show each broker's topics, offsets, groups, pending halves and key metrics, then the
    cluster's totals."""

    async def main() -> dict:
        async with AdminClient(namesrv, **credentials) as admin:
            return await admin.status()

    deadline = time.monotonic() + wait_s
    docs = run(main)
    while (waiting := masterless(docs.values())) and (left := deadline - time.monotonic()) > 0:
        click.echo(f"waiting for a master of {', '.join(waiting)} ({left:.0f} s left)", err=True)
        time.sleep(min(1.0, left))
        docs = run(main)
    if as_json:
        click.echo(orjson.dumps(docs, option=orjson.OPT_INDENT_2).decode())
        return
    console = Console(width=160)
    shown_groups: set[str] = set()
    sets = worker_sets(docs)
    # Sorted by group (stably: members keep their order), so a down member follows its group.
    for doc in sorted(docs.values(), key=lambda d: d.get("brokerName", "")):
        group = doc.get("brokerName", "")
        worker = split_worker_name(group)
        if worker is not None:  # one machine's workers: shown once, as one broker
            if worker[0] not in shown_groups:
                shown_groups.add(worker[0])
                print_workers(console, worker[0], sets[worker[0]], system)
            continue
        if group not in shown_groups:
            shown_groups.add(group)
            line = group_line(group, docs.values())
            if line:
                console.print(line, highlight=False)
        if doc.get("role") == "down":
            console.print(f"[bold]broker {doc.get('label')}[/bold]  {down_text(doc, time.time())}",
                          highlight=False)
            continue
        name = broker_heading(doc)
        if "error" in doc:
            console.print(f"[bold]broker {name}[/bold]  {doc['error']}")
            continue
        info = doc.get("broker") or {}
        console.print(f"[bold]broker {name}[/bold]  "
                      f"cluster={info.get('cluster', '')} flush={info.get('flushMode', '')} "
                      f"uptime={info.get('uptimeSeconds', '')}s  "
                      f"pending half messages: [bold]{doc.get('pendingHalfMessages', 0)}[/bold]")
        trouble = (doc.get("replication") or {}).get("replicationError")
        if trouble:
            console.print(f"[bold red]replication stopped:[/bold red] {trouble}", highlight=False)
        console.print(topics_table([("", doc)], system))
        console.print(groups_table([("", doc)], system))
        producers = doc.get("producerGroups") or {}
        if producers:
            console.print("producer groups: " + ", ".join(f"{g} ({n})" for g, n in sorted(producers.items())))
        metrics = doc.get("metrics") or {}
        console.print("metrics: " + "  ".join(f"{k}={metrics[k]}" for k in KEY_METRICS if k in metrics))

    if len(docs) > 1:
        console.print(totals_line(docs, system))


def worker_sets(docs: dict[str, dict]) -> dict[str, list[tuple[str, dict]]]:
    """The workers of each ``txbroker serve --workers N`` (broker names ``<name>-w<i>``,
    txbroker/workers.py): base name -> [(``w<i>``, document)] in worker order."""
    sets: dict[str, list[tuple[int, dict]]] = {}
    for doc in docs.values():
        worker = split_worker_name(doc.get("brokerName", ""))
        if worker is not None:
            sets.setdefault(worker[0], []).append((worker[1], doc))
    return {base: [(f"w{i}", d) for i, d in sorted(members, key=lambda m: m[0])]
            for base, members in sets.items()}


def print_workers(console: Console, base: str, members: list[tuple[str, dict]],
                  system: bool) -> None:
    """One broker run as workers: a heading with the summed pending halves, a line per
    worker, then the topics and groups of all workers in one table each (a worker column)."""
    up = [(w, d) for w, d in members if "error" not in d and d.get("role") != "down"]
    pending = sum(int(d.get("pendingHalfMessages", 0) or 0) for _, d in up)
    info = next(((d.get("broker") or {}) for _, d in up), {})
    console.print(f"[bold]broker {base}[/bold]  {len(up)} of {len(members)} workers up  "
                  f"cluster={info.get('cluster', '')} flush={info.get('flushMode', '')}  "
                  f"pending half messages: [bold]{pending}[/bold]", highlight=False)
    for w, d in members:
        if d.get("role") == "down":
            state = down_text(d, time.time())
        elif "error" in d:
            state = d["error"]
        else:  # flush mode and version are the heading's: the same for every worker
            metrics = d.get("metrics") or {}
            state = (f"{d.get('role')}, uptime={(d.get('broker') or {}).get('uptimeSeconds', '')}s  " +
                     "  ".join(f"{k}={metrics[k]}" for k in WORKER_METRICS if k in metrics))
        console.print(f"  worker {w} {d.get('label')}: {state}", highlight=False)
    console.print(topics_table(up, system))
    console.print(groups_table(up, system))
    producers: dict[str, int] = {}
    for _, d in up:
        for g, n in (d.get("producerGroups") or {}).items():
            producers[g] = max(producers.get(g, 0), int(n))
    if producers:
        console.print("producer groups: " + ", ".join(f"{g} ({n})" for g, n in sorted(producers.items())))


def topics_table(rows: list[tuple[str, dict]], system: bool) -> Table:
    """Topics with queue offsets; with ``rows`` from workers, a worker column."""
    workers = any(w for w, _ in rows)
    table = Table(title="topics")
    for col in ("topic",) + (("worker",) if workers else ()) + (
            "queues", "messages", "queue offsets (min..max)"):
        table.add_column(col, overflow="fold")
    cells = []
    for w, doc in rows:
        for topic, t in (doc.get("topics") or {}).items():
            if not system and is_system_topic(topic):
                continue
            queues = t.get("queues") or []
            total = sum(int(q.get("maxOffset", 0)) - int(q.get("minOffset", 0)) for q in queues)
            offsets = " ".join(f"{q.get('queueId')}:{q.get('minOffset')}..{q.get('maxOffset')}"
                               for q in queues)
            cells.append((topic, w, str(t.get("readQueueNums", len(queues))), str(total), offsets))
    for topic, w, *rest in sorted(cells, key=lambda c: (c[0], c[1])):
        table.add_row(topic, *((w,) if workers else ()), *rest)
    return table


def groups_table(rows: list[tuple[str, dict]], system: bool) -> Table:
    """Consumer groups with committed offsets; with ``rows`` from workers, a worker column."""
    workers = any(w for w, _ in rows)
    table = Table(title="consumer groups")
    for col in ("group",) + (("worker",) if workers else ()) + ("members", "committed offsets"):
        table.add_column(col, overflow="fold")
    cells = []
    for w, doc in rows:
        for group, g in (doc.get("consumerGroups") or {}).items():
            offsets = "; ".join(
                f"{topic} " + " ".join(f"{q}:{o}" for q, o in sorted(qs.items()))
                for topic, qs in sorted((g.get("offsets") or {}).items())
                if system or not is_system_topic(topic))
            cells.append((group, w, str(len(g.get("consumers") or [])), offsets))
    for group, w, *rest in sorted(cells, key=lambda c: (c[0], c[1])):
        table.add_row(group, *((w,) if workers else ()), *rest)
    return table


def down_text(doc: dict, now: float) -> str:
    """``down since 07:41:02 (35 s ago: connection closed)``: when the name server dropped
    the broker (this machine's local time) and why."""
    since = int(doc.get("downSince", 0)) / 1000
    ago = max(0, now - since)
    clock = datetime.fromtimestamp(since).strftime("%H:%M:%S" if ago < 86400 else "%Y-%m-%d %H:%M:%S")
    return f"down since {clock} ({ago:.0f} s ago: {doc.get('downReason', 'dropped')})"


def broker_heading(doc: dict) -> str:
    """``name@address (role, epoch N)``; no epoch for a single broker (it has no group)."""
    epoch = f", epoch {doc['epoch']}" if "epoch" in doc else ""
    return f"{doc.get('label')} ({doc.get('role')}{epoch})"


def _masters(group: str, docs) -> list[dict]:
    """The documents of ``group``'s members that say they are its master."""
    return [d for d in docs if d.get("brokerName") == group and d.get("role") == "master"
            and isinstance(d.get("replication"), dict)]


def masterless(docs) -> list[str]:
    """The replicated groups (members that report replication) with no master now."""
    docs = list(docs)
    groups = {d.get("brokerName", "") for d in docs if isinstance(d.get("replication"), dict)}
    return sorted(g for g in groups if not _masters(g, docs))


def group_line(group: str, docs) -> str:
    """``group G: master M, epoch N, in sync: A, B`` from the group's master document (the
    broker that says it is master); empty for a single broker or a group with no master."""
    masters = _masters(group, docs)
    if not masters:
        members = [d for d in docs if d.get("brokerName") == group]
        if any(isinstance(d.get("replication"), dict) for d in members):
            return f"group {group}: no master now"
        return ""
    master = masters[0]
    in_sync = ", ".join(master.get("inSyncReplicas") or []) or "none"
    return (f"group {group}: master {master['label']}, epoch {master.get('epoch')}, "
            f"in sync: {in_sync}")


def totals_line(docs: dict[str, dict], system: bool) -> str:
    """The cluster's totals: brokers (reachable of listed), groups, pending halves (masters
    only: a slave's halves are copies), messages in the shown topics (masters only)."""
    masters = [d for d in docs.values() if d.get("role") == "master" and "error" not in d]
    pending = sum(int(d.get("pendingHalfMessages", 0) or 0) for d in masters)
    messages = sum(int(q.get("maxOffset", 0)) - int(q.get("minOffset", 0))
                   for d in masters for topic, t in (d.get("topics") or {}).items()
                   if system or not is_system_topic(topic) for q in t.get("queues") or [])
    up = sum("error" not in d and d.get("role") != "down" for d in docs.values())
    groups = len({d.get("brokerName") for d in docs.values()})
    workers = [split_worker_name(d.get("brokerName", "")) for d in docs.values()]
    if all(workers) and len({w[0] for w in workers if w}) == 1:  # one broker's workers only
        return (f"total: {up} of {len(docs)} workers up  pending half messages: {pending}  "
                f"messages: {messages}")
    return (f"total: {up} of {len(docs)} broker(s) reachable in {groups} group(s)  "
            f"pending half messages: {pending}  messages: {messages}")
