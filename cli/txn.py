"""``txbroker txn``: list pending half messages and resolve them by hand.

A half message stays pending while its producer neither committed nor rolled it back and no
check-back got an answer (the producer group is gone, or its database cannot tell).  These
commands show such halves and let an operator decide; the broker logs every decision with the
operator's name and the time.
"""

from __future__ import annotations

import getpass
import time

import click
import orjson
from rich.console import Console
from rich.table import Table

from cli.common import credentials_options, namesrv_option, run
from txbroker.client.admin import AdminClient


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
    """Pending transactions (half messages): list, show, commit, rollback, resume."""


@txn.command("list")
@click.option("--state", type=click.Choice(["pending", "discarded", "all"]), default="pending",
              show_default=True, help="Pending halves, halves the check service gave up on, or both.")
@click.option("--json", "as_json", is_flag=True, help="Print the rows as a JSON array.")
@namesrv_option
@credentials_options
def list_(state: str, as_json: bool, namesrv: str, credentials: dict[str, str]) -> None:
    """List half messages waiting for a decision."""

    async def main() -> list[dict]:
        async with AdminClient(namesrv, **credentials) as admin:
            return await admin.txn_list(state)

    rows = run(main)
    if as_json:
        click.echo(orjson.dumps(rows).decode())
        return
    now_ms = int(time.time() * 1000)
    table = Table(title=f"{len(rows)} {state} half message(s)" if state != "all"
                  else f"{len(rows)} pending or discarded half message(s)")
    for col in ("id", "topic", "keys", "producer group", "age", "checks", "state"):
        table.add_column(col, overflow="fold")
    for row in rows:
        table.add_row(str(_pick(row, "id", "offset_msg_id")), str(_pick(row, "topic")),
                      str(_pick(row, "keys")), str(_pick(row, "producer_group")), _age(row, now_ms),
                      str(_pick(row, "checks", default=0)), str(_pick(row, "state")))
    Console(width=160).print(table)


@txn.command()
@click.argument("txn_id")
@namesrv_option
@credentials_options
def show(txn_id: str, namesrv: str, credentials: dict[str, str]) -> None:
    """Show one half message (by transaction id or offsetMsgId) as JSON."""

    async def main() -> dict:
        async with AdminClient(namesrv, **credentials) as admin:
            return await admin.txn_show(txn_id)

    click.echo(orjson.dumps(run(main), option=orjson.OPT_INDENT_2).decode())


def _decision_command(decision: str, help_text: str) -> click.Command:
    @click.command(name=decision, help=help_text)
    @click.argument("txn_id")
    @click.option("--operator", default=_operator, show_default="the OS user",
                  help="Who decides (recorded by the broker).")
    @namesrv_option
    @credentials_options
    def command(txn_id: str, operator: str, namesrv: str, credentials: dict[str, str]) -> None:
        async def main() -> dict:
            async with AdminClient(namesrv, **credentials) as admin:
                return await admin.txn_decide(txn_id, decision, operator)

        doc = run(main)
        outcome = {"apply": "done", "duplicate": "already so"}.get(str(doc.get("outcome")), "done")
        click.echo(f"{decision} {txn_id}: {outcome}, now {_pick(doc, 'state', default='?')} "
                   f"(operator {operator})")

    return command


txn.add_command(_decision_command("commit", "Commit a pending half message: it becomes visible."))
txn.add_command(_decision_command("rollback", "Roll back a pending half message: it is discarded."))
txn.add_command(_decision_command(
    "resume", "Put a discarded half message back under check-back (after the producer is fixed)."))
