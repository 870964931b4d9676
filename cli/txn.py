"""``txbroker txn``: list pending half messages and resolve them by hand.

A half message stays pending while its producer neither committed nor rolled it back and no
check-back got an answer (the producer group is gone, or its database cannot tell).  These
commands show such halves and let an operator decide; the broker logs every decision with the
operator's name and the time, and keeps a bounded history of decisions, so ``show`` also
answers for a decided transaction (who decided, when) and deciding it again is harmless: the
same decision answers "already committed", a contradicting one is refused.

Kafka transactions (the Kafka listener's coordinator) are listed beside the halves, and
``--state`` means the same for both kinds: ``pending`` (the default) is what waits for a
decision, a pending half or an open Kafka transaction; ``discarded`` is what the broker gave
up on and keeps for an operator, which only halves can be (an open Kafka transaction is
aborted at its timeout instead); ``all`` is both.  ``--kafka-all`` lists every transactional
id the coordinator knows, open or not (Kafka's ``kafka-transactions.sh list``), ``--hanging``
only those open past their ``transaction.timeout.ms`` (``find-hanging``).  ``show`` answers a
transactional id, and ``abort`` aborts one as an operator, which fences its producer; commit,
rollback and resume are half-message decisions and point a transactional id to ``abort``.
"""

from __future__ import annotations

import getpass
import time
from collections.abc import Callable
from datetime import datetime

import click
import orjson
from rich.console import Console
from rich.table import Table

from txbroker.cli.common import (
    CommandError,
    command_name,
    credentials_options,
    namesrv_option,
    run,
)
from txbroker.client.admin import AdminClient, KafkaTransactionalIdError
from txbroker.workers import split_worker_name


def _pick(row: dict, *names: str, default: object = "") -> object:
    for name in names:
        if row.get(name) not in (None, ""):
            return row[name]
    return default


def _age(row: dict, now_ms: int) -> str:
    age = _pick(row, "age_s", default=None)
    if age is None:
        born = _pick(row, "storeTimestamp", "bornTimestamp", default=None)
        if born is None:
            return ""
        try:
            age = max(now_ms - int(born), 0) / 1000.0
        except (TypeError, ValueError):
            return ""
    try:
        seconds = float(age)
    except (TypeError, ValueError):
        return str(age)
    if seconds < 120:
        return f"{seconds:.1f}s"
    if seconds < 7200:
        return f"{seconds / 60:.1f}m"
    return f"{seconds / 3600:.1f}h"


def _operator() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return "unknown"


@click.group()
def txn() -> None:
    """Transactions waiting for a decision: half messages (list, show, commit, rollback,
    resume) and Kafka transactions (list, show, abort)."""


def _ms_age(ms: object) -> str:
    return _age({"age_s": ms / 1000}, 0) if isinstance(ms, int) else ""


def _kafka_table(rows: list[dict], title: str, with_group: bool, column: str = "broker group",
                 cell: Callable[[object], str] = str) -> Table:
    """Kafka transactions, one row per transactional id (``with_group``: first, the broker
    group whose coordinator holds it, in ``column``, written by ``cell``)."""
    table = Table(title=title)
    for col in ((column,) if with_group else ()) + (
            "transactional id", "producer id", "epoch", "state", "partitions", "age",
            "timeout", "hanging"):
        table.add_column(col, overflow="fold")
    for row in rows:
        parts = ", ".join(f"{t}-{p}" for t, p in row.get("partitions") or [])
        table.add_row(*((cell(row.get("broker")),) if with_group else ()),
                      str(row.get("transactional_id")), str(row.get("producer_id")),
                      str(row.get("producer_epoch")), str(row.get("state")), parts,
                      _ms_age(row.get("age_ms")), _ms_age(row.get("timeout_ms")),
                      "yes" if row.get("hanging") else "")
    return table


@txn.command("list")
@click.option("--state", type=click.Choice(["pending", "discarded", "all"]), default="pending",
              show_default=True, help="The same for both kinds: 'pending' waits for a decision "
              "(pending halves, open Kafka transactions); 'discarded' was given up on and waits "
              "for an operator (halves only: a Kafka transaction is aborted at its timeout); "
              "'all' is both.")
@click.option("--kafka-all", is_flag=True,
              help="Every Kafka transactional id the coordinator knows, open or not (Kafka's "
                   "kafka-transactions.sh list), instead of the open ones.")
@click.option("--hanging", is_flag=True,
              help="Only Kafka transactions open past their transaction timeout (the halves "
                   "are left out: a pending half is waiting for its check-back by design).")
@click.option("--json", "as_json", is_flag=True,
              help="Print the rows as a JSON array (Kafka rows have \"kind\": \"kafka\").")
@namesrv_option
@credentials_options
def list_(state: str, kafka_all: bool, hanging: bool, as_json: bool, namesrv: str,
          credentials: dict[str, str]) -> None:
    """List half messages waiting for a decision and open Kafka transactions, across every
    broker group (in a cluster, a column names each row's group; --json rows have "broker")."""
    # an open Kafka transaction is "pending"; none is ever "discarded"
    with_kafka = kafka_all or hanging or state != "discarded"

    async def main() -> tuple[list[dict], list[dict], list[str]]:
        async with AdminClient(namesrv, **credentials) as admin:
            halves = [] if hanging else await admin.txn_list(state)
            kafka = (await admin.kafka_txn_list(open_only=not kafka_all, hanging=hanging)
                     if with_kafka else [])
            return halves, kafka, sorted({name for name, _, _ in admin.members()})

    rows, kafka_rows, groups = run(main)
    if as_json:
        click.echo(orjson.dumps(rows + kafka_rows).decode())
        return
    # the group column depends on the cluster, not on the rows: a cluster whose transactions
    # all sit in one group still says which
    several = len(groups) > 1
    # one broker run as workers (txbroker/workers.py) is one broker: its column names the worker
    parsed = [split_worker_name(g) for g in groups]
    as_workers = several and all(parsed) and len({p[0] for p in parsed if p}) == 1
    column = "worker" if as_workers else "broker group"

    def cell(group: object) -> str:
        worker = split_worker_name(str(group)) if as_workers else None
        return f"w{worker[1]}" if worker else str(group)
    console = Console(width=160)
    if hanging:
        console.print(_kafka_table(kafka_rows, f"{len(kafka_rows)} hanging Kafka transaction(s)",
                                   several, column, cell))
        return
    if kafka_rows:
        console.print(_kafka_table(kafka_rows, f"{len(kafka_rows)} Kafka transaction(s)" if
                                   kafka_all else f"{len(kafka_rows)} open Kafka transaction(s)",
                                   several, column, cell))
    now_ms = int(time.time() * 1000)
    by_group = dict.fromkeys(groups, 0)
    for row in rows:
        by_group[str(row.get("broker"))] = by_group.get(str(row.get("broker")), 0) + 1
    table = Table(title=f"{len(rows)} {state} half message(s)" if state != "all"
                  else f"{len(rows)} pending or discarded half message(s)")
    for col in ((column,) if several else ()) + (
            "id", "topic", "keys", "producer group", "age", "checks", "state"):
        table.add_column(col, overflow="fold")
    for row in rows:
        table.add_row(*((cell(row.get("broker")),) if several else ()),
                      str(_pick(row, "id", "offset_msg_id")), str(_pick(row, "topic")),
                      str(_pick(row, "keys")), str(_pick(row, "producer_group")), _age(row, now_ms),
                      str(_pick(row, "checks", default=0)), str(_pick(row, "state")))
    console.print(table)
    if several:  # per broker group, then the total (the table title)
        console.print(f"per {column}: " + "  ".join(f"{cell(b)}={n}" for b, n in by_group.items()))


def _words(state: object) -> str:
    return str(state).replace("_", " ")


def _when(ms: object) -> str:
    """Epoch milliseconds as local time with the offset, to the millisecond."""
    if not isinstance(ms, int):
        return "unknown"
    return datetime.fromtimestamp(ms / 1000).astimezone().isoformat(sep=" ", timespec="milliseconds")


def _decided_by(doc: dict) -> str:
    source = doc.get("source")
    if source == "operator":
        return f"operator {doc.get('operator') or '?'}"
    if source == "producer":
        return "producer (END_TRANSACTION)"
    if source == "check" and doc.get("state") == "discarded":
        return f"check service (no answer after {doc.get('checks', '?')} checks)"
    if source == "check":
        return "producer's answer to a check-back"
    return "unknown (not recorded, or lost in a crash)"


def _show_lines(doc: dict) -> list[tuple[str, str]]:
    """``txn show`` as label/value pairs, decision first."""
    lines = [("transaction", str(_pick(doc, "id", "offset_msg_id"))),
             ("state", _words(doc.get("state", "?")))]
    if "source" in doc:
        lines.append(("decided by", _decided_by(doc)))
    lines.append(("prepared at", _when(doc.get("prepared_at"))))
    if "source" in doc:
        decided, prepared = doc.get("decided_at"), doc.get("prepared_at")
        after = (f" ({(decided - prepared) / 1000:.3f} s after prepare)"
                 if isinstance(decided, int) and isinstance(prepared, int) else "")
        lines.append(("decided at", _when(decided) + after))
    lines += [("topic", f"{_pick(doc, 'topic')} (queue {_pick(doc, 'queue_id', default='?')})"),
              ("keys", str(_pick(doc, "keys"))),
              ("tags", str(_pick(doc, "tags"))),
              ("producer group", str(_pick(doc, "producer_group")))]
    # the broker leaves ``checks`` out when it no longer knows the count: no line, not a 0
    if doc.get("checks") is not None:
        lines.append(("checks", str(doc["checks"])))
    lines += [("body size", f"{_pick(doc, 'body_size', default='?')} bytes"),
              ("offsetMsgId", str(_pick(doc, "offset_msg_id"))),
              ("broker", str(_pick(doc, "broker")))]
    return lines


def _kafka_show_lines(doc: dict) -> list[tuple[str, str]]:
    """``txn show`` of a Kafka transactional id as label/value pairs."""
    parts = ", ".join(f"{t}-{p}" for t, p in doc.get("partitions") or []) or "none"
    hanging = " (hanging: open past its timeout)" if doc.get("hanging") else ""
    return [("transactional id", str(doc.get("transactional_id"))),
            ("kind", "Kafka transaction"),
            ("state", f"{doc.get('state')}{hanging}"),
            ("producer id", str(doc.get("producer_id"))),
            ("producer epoch", str(doc.get("producer_epoch"))),
            ("partitions", parts),
            ("groups", ", ".join(doc.get("groups") or []) or "none"),
            ("timeout", _ms_age(doc.get("timeout_ms"))),
            ("started at", _when(doc.get("started_ms")) if doc.get("started_ms") else "none open"),
            ("updated at", _when(doc.get("updated_ms"))),
            ("age", _ms_age(doc.get("age_ms"))),
            ("broker", str(doc.get("broker")))]


@txn.command()
@click.argument("txn_id")
@click.option("--json", "as_json", is_flag=True,
              help="Print the broker's whole answer (with the half's properties) as JSON.")
@namesrv_option
@credentials_options
def show(txn_id: str, as_json: bool, namesrv: str, credentials: dict[str, str]) -> None:
    """Show one transaction (by transaction id or offsetMsgId): pending, discarded or decided,
    and for a decided one who decided (producer, check-back or operator) and when; or a Kafka
    transactional id: its producer id, epoch, state, partitions and age."""

    async def main() -> dict:
        async with AdminClient(namesrv, **credentials) as admin:
            return await admin.txn_show(txn_id)

    doc = run(main)
    if as_json:
        click.echo(orjson.dumps(doc, option=orjson.OPT_INDENT_2).decode())
        return
    pairs = _kafka_show_lines(doc) if doc.get("kind") == "kafka" else _show_lines(doc)
    width = max(len(label) for label, _ in pairs)
    for label, value in pairs:
        click.echo(f"{label:<{width}}  {value}")


def _decision_command(decision: str, help_text: str) -> click.Command:
    @click.command(name=decision, help=help_text)
    @click.argument("txn_id")
    @click.option("--operator", default=_operator, show_default="the OS user",
                  help="Who decides (recorded by the broker).")
    @namesrv_option
    @credentials_options
    def command(txn_id: str, operator: str, namesrv: str, credentials: dict[str, str]) -> None:
        what = command_name(click.get_current_context())

        async def main() -> dict:
            async with AdminClient(namesrv, **credentials) as admin:
                try:
                    return await admin.txn_decide(txn_id, decision, operator)
                except KafkaTransactionalIdError as exc:
                    raise CommandError(what, exc.addr, f"{exc.reason}: txbroker txn abort "
                                                        f"{txn_id}") from None

        doc = run(main)
        state = _words(_pick(doc, "state", default="?"))
        if doc.get("outcome") == "duplicate":
            click.echo(f"{decision} {txn_id}: already {state}, nothing changed")
        else:
            click.echo(f"{decision} {txn_id}: done, now {state} (operator {operator})")

    return command


txn.add_command(_decision_command("commit", "Commit a pending half message: it becomes visible. "
                                  "(A Kafka transaction is committed by its producer only; an "
                                  "operator can abort it: txn abort.)"))
txn.add_command(_decision_command("rollback", "Roll back a pending half message: it is discarded. "
                                  "(A Kafka transaction: txn abort.)"))
txn.add_command(_decision_command(
    "resume", "Put a discarded half message back under check-back (after the producer is fixed)."))


@txn.command()
@click.argument("transactional_id")
@click.option("--operator", default=_operator, show_default="the OS user",
              help="Who aborts (recorded by the broker).")
@namesrv_option
@credentials_options
def abort(transactional_id: str, operator: str, namesrv: str, credentials: dict[str, str]) -> None:
    """Abort a Kafka transaction (by transactional id): none of its records or offsets become
    visible, and its producer is fenced (its next request fails with PRODUCER_FENCED; the
    application restarts it with InitProducerId)."""

    async def main() -> dict:
        async with AdminClient(namesrv, **credentials) as admin:
            return await admin.kafka_txn_abort(transactional_id, operator)

    doc = run(main)
    if doc.get("outcome") == "aborted":
        click.echo(f"abort {transactional_id}: done, producer {doc.get('producer_id')} fenced "
                   f"(epoch now {doc.get('producer_epoch')}, state {doc.get('state')}, "
                   f"operator {operator})")
    else:
        click.echo(f"abort {transactional_id}: no open transaction (state {doc.get('state')}), "
                   "nothing changed")
