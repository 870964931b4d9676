"""``txbroker produce``: send messages, plain or transactional, from the command line.

With ``--transactional`` each message is sent as a half message and the "local transaction" is
the ``--decision`` given: ``commit`` makes it visible, ``rollback`` discards it, ``unknown``
leaves it pending so the broker checks back (this command answers UNKNOW again while it runs;
an operator can then resolve it with ``txbroker txn commit|rollback``).

Output keeps data and report apart, so ``--count 100000`` into a pipe is clean: per-message
lines (``--verbose``, ``--json``) on stdout; the progress bar (on a terminal only), one summary
line, what became of the transactions and any error on stderr.

The summary counts what the broker acknowledged, and among it what was stored without the full
promise (no slave, a slave or the disk too slow: :data:`STORED_CAVEATS`), since "sent 8" after
a failover would hide that 4 of them are on the master only.  Ctrl-C ends the run with the
summary too, marked ``interrupted``, and a send in flight at that moment counted as in doubt:
the broker may or may not have stored it, so neither "sent" nor "failed" would be true.
"""

from __future__ import annotations

import asyncio
import math
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import click
import orjson
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeRemainingColumn,
)

from txbroker.cli.common import (
    CommandError,
    credentials_options,
    explain,
    namesrv_option,
    run,
)
from txbroker.client import (
    LocalTransactionState,
    Message,
    MessageExt,
    Producer,
    SendResult,
    SendStatus,
    TransactionListener,
    TransactionProducer,
)
from txbroker.client.errors import ClientError, TopicNotFoundError
from txbroker.client.message import wire_body

#: A send that fails for these reasons counts as failed and the run goes on; anything else
#: (a bug, Ctrl-C) stops it.
SEND_FAILURES = (ClientError, OSError, TimeoutError)

DECISIONS = {
    "commit": LocalTransactionState.COMMIT_MESSAGE,
    "rollback": LocalTransactionState.ROLLBACK_MESSAGE,
    "unknown": LocalTransactionState.UNKNOW,
}


#: Statuses of a message stored without the full promise of SEND_OK, each named for what is
#: not (yet) true of it: the summary counts them apart, the per-message lines say it.
STORED_CAVEATS = {
    SendStatus.SLAVE_NOT_AVAILABLE: "not yet replicated",  # on the master only: no slave in sync
    SendStatus.FLUSH_SLAVE_TIMEOUT: "replication not confirmed in time",
    SendStatus.FLUSH_DISK_TIMEOUT: "disk flush not confirmed in time",
}


@dataclass
class Tally:
    """What became of the sends of one run, as the summary line reports it."""

    #: Acknowledged by the broker, i.e. stored (``caveats`` counts the subset stored without
    #: the full promise).
    sent: int = 0
    failed: int = 0
    caveats: Counter[SendStatus] = field(default_factory=Counter)
    #: Sends in flight when the run was interrupted: stored or not, this process cannot know.
    in_doubt: int = 0
    interrupted: bool = False
    latencies: list[float] = field(default_factory=list)


class _FixedDecision(TransactionListener):
    """The CLI's local transaction: the decision given on the command line."""

    def __init__(self, state: LocalTransactionState) -> None:
        self.state = state

    def execute_local_transaction(self, msg: MessageExt, arg: object) -> LocalTransactionState:
        return self.state

    def check_local_transaction(self, msg: MessageExt) -> LocalTransactionState:
        # This process keeps no durable state, so it cannot know better than "unknown".
        return LocalTransactionState.UNKNOW


def _doc(result: SendResult) -> dict:
    doc = {"status": result.send_status.name, "msg_id": result.msg_id,
           "offset_msg_id": result.offset_msg_id, "topic": result.topic,
           "broker": result.broker_name, "queue_id": result.queue_id,
           "queue_offset": result.queue_offset}
    caveat = STORED_CAVEATS.get(result.send_status)
    if caveat is not None:
        doc["caveat"] = caveat
    state = getattr(result, "local_transaction_state", None)
    if state is not None:
        doc["transaction_id"] = result.transaction_id  # type: ignore[attr-defined]
        doc["local_transaction_state"] = state.name
    return doc


def _line(doc: dict, as_json: bool) -> str:
    if as_json:
        return orjson.dumps(doc).decode()
    return " ".join(f"{k}={v!r}" if " " in str(v) else f"{k}={v}" for k, v in doc.items())


def _percentile(sorted_values: list[float], q: float) -> float:
    """Nearest-rank percentile of an ascending list (0.0 when empty)."""
    if not sorted_values:
        return 0.0
    return sorted_values[min(len(sorted_values) - 1, max(0, math.ceil(q * len(sorted_values)) - 1))]


def summary_line(tally: Tally, seconds: float) -> str:
    """``sent 50, failed 0 in 0.21 s: 238 msgs/s, latency p50 3.9 ms, p99 7.1 ms``;
    ``sent 8 (4 not yet replicated), failed 0 in ...`` when some were stored without the full
    promise; ``interrupted: sent 14,971, failed 0, 1 in doubt (...) in ...`` after Ctrl-C."""
    ordered = sorted(tally.latencies)
    rate = tally.sent / seconds if seconds > 0 else 0.0
    caveats = ", ".join(f"{tally.caveats[status]:,} {text}"
                        for status, text in STORED_CAVEATS.items() if tally.caveats[status])
    counts = f"sent {tally.sent:,}" + (f" ({caveats})" if caveats else "") + f", failed {tally.failed:,}"
    if tally.interrupted:
        counts = f"interrupted: {counts}"
        if tally.in_doubt:
            counts += f", {tally.in_doubt:,} in doubt (in flight: stored or not)"
    return (f"{counts} in {seconds:.2f} s: {rate:,.0f} msgs/s, "
            f"latency p50 {_percentile(ordered, 0.50) * 1000:.1f} ms, "
            f"p99 {_percentile(ordered, 0.99) * 1000:.1f} ms")


def transaction_line(decision: str, txn_ids: list[str], group: str) -> str:
    """What became of the transactions: the decision sent, and what it means for consumers."""
    n = len(txn_ids)
    subject = f"transaction {txn_ids[0]}" if n == 1 else f"{n:,} transactions"
    if decision == "commit":
        return f"{subject} committed: visible to consumers"
    if decision == "rollback":
        return f"{subject} rolled back: never visible to consumers"
    txn_id = txn_ids[0] if n == 1 else "<id>"
    listing = "" if n == 1 else " (ids: `txbroker txn list`)"
    return (f"{subject} left unknown: the broker will check back the producer group {group}; "
            f"decide {'it' if n == 1 else 'them'} now with `txbroker txn commit {txn_id}` or "
            f"`txbroker txn rollback {txn_id}`{listing}")


def _progress(count: int) -> Progress:
    """A progress bar on stderr, drawn only on a terminal: pipes and logs get no bar at all."""
    console = Console(stderr=True)
    return Progress(TextColumn("sending"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(),
                    console=console, transient=True, disable=count < 2 or not console.is_terminal)


@click.command()
@click.option("--topic", required=True, help="Topic to send to.")
@click.option("--body", help="Message body (UTF-8 text).")
@click.option("--file", "path", type=click.Path(dir_okay=False, allow_dash=True),
              help="Read the body from a file ('-' = stdin).")
@click.option("--keys", help="Message keys, space-separated.")
@click.option("--tags", help="Message tag.")
@click.option("--property", "properties", multiple=True, metavar="NAME=VALUE",
              help="User property (repeatable).")
@click.option("--count", default=1, show_default=True, type=click.IntRange(1, 1_000_000),
              help="Send the message this many times.")
@click.option("--group", default="txbroker-cli-producer", show_default=True, help="Producer group.")
@click.option("--transactional", is_flag=True, help="Send as a transactional message.")
@click.option("--decision", type=click.Choice(sorted(DECISIONS)), default="commit", show_default=True,
              help="Local transaction outcome (with --transactional).")
@click.option("--verbose", "-v", is_flag=True, help="One line per sent message on stdout.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per sent message on stdout.")
@click.option("--timeout", default=3.0, show_default=True, type=click.FloatRange(0.1, 600),
              help="Send timeout in seconds.")
@click.option("--create/--no-create", default=True, show_default=True,
              help="Let the send create a topic the name server does not know (the broker's "
                   "auto-create; stderr says so); --no-create refuses such a topic.")
@namesrv_option
@credentials_options
def produce(topic: str, body: str | None, path: str | None, keys: str | None, tags: str | None,
            properties: tuple[str, ...], count: int, group: str, transactional: bool,
            decision: str, verbose: bool, as_json: bool, timeout: float, create: bool,
            namesrv: str, credentials: dict[str, str]) -> None:
    """Send a message (or --count of them) to TOPIC.

    Prints one summary line to stderr (sent, of which stored without the full promise, failed,
    msgs/s, p50/p99 latency; after Ctrl-C "interrupted" and the sends in doubt), with a progress
    bar while sending on a terminal; per-message lines on stdout only with --verbose or --json.
    Exits 1 if any send failed.
    """
    if (body is None) == (path is None):
        raise click.UsageError("give exactly one of --body or --file")
    if not transactional and decision != "commit":
        raise click.UsageError("--decision needs --transactional")
    if path is not None:
        try:
            data = sys.stdin.buffer.read() if path == "-" else Path(path).read_bytes()
        except OSError as exc:
            raise CommandError("read the body", path, exc.strerror or str(exc)) from None
    else:
        data = body.encode()
    props = {}
    for item in properties:
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise click.UsageError(f"--property {item!r}: expected NAME=VALUE")
        props[name] = value
    what = f"send to topic {topic!r}"
    per_message = verbose or as_json

    async def main() -> tuple[Tally, list[str], CommandError | None]:
        if transactional:
            producer = TransactionProducer(group, namesrv, listener=_FixedDecision(DECISIONS[decision]),
                                           send_timeout=timeout, create_topics=create, **credentials)
        else:
            producer = Producer(group, namesrv, send_timeout=timeout, create_topics=create,
                                **credentials)
        msg = Message(topic, data, tags=tags, keys=keys, properties=props or None)
        # A bad or oversized message fails once, here, not --count times.
        msg.validate()
        wire_body(msg.body, producer.compress_threshold, producer.max_message_size)
        tally = Tally()
        txn_ids: list[str] = []
        first_failure: CommandError | None = None
        started = None
        try:
            async with producer:
                started = time.perf_counter()  # sending time: connecting is not counted
                with _progress(count) as progress:
                    bar = progress.add_task("send", total=count)
                    for _ in range(count):
                        t0 = time.perf_counter()
                        tally.in_doubt = 1  # until the broker's answer (or a failure) is in
                        try:
                            if transactional:
                                result = await producer.send_message_in_transaction(msg)
                            else:
                                result = await producer.send(msg)
                        except SEND_FAILURES as exc:
                            tally.in_doubt = 0
                            if isinstance(exc, TopicNotFoundError) and not create:
                                # Every send would be refused alike: one error, no summary.
                                raise CommandError(what, exc.addr, f"{exc.reason} (--no-create); "
                                                   f"create it with 'txbroker topic create "
                                                   f"{topic}'") from None
                            error = explain(exc, what, namesrv)
                            tally.failed += 1
                            first_failure = first_failure or error
                            if per_message:
                                click.echo(_line({"status": "FAILED", "error": error.message}, as_json))
                        else:
                            tally.in_doubt = 0
                            tally.latencies.append(time.perf_counter() - t0)
                            tally.sent += 1
                            if result.send_status in STORED_CAVEATS:
                                tally.caveats[result.send_status] += 1
                            if transactional:
                                txn_ids.append(result.transaction_id)  # type: ignore[attr-defined]
                            if per_message:
                                click.echo(_line(_doc(result), as_json))
                        progress.advance(bar)
        except asyncio.CancelledError:  # Ctrl-C or SIGTERM (cli.common.run cancels us)
            tally.interrupted = True
            raise
        finally:
            # Also after Ctrl-C: what was sent so far, and what may have been.
            if topic in producer.created_topics:
                click.echo(f"created topic {topic!r}", err=True)
            if started is not None and (tally.sent or tally.interrupted or 0 < tally.failed < count):
                click.echo(summary_line(tally, time.perf_counter() - started), err=True)
        return tally, txn_ids, first_failure

    tally, txn_ids, first_failure = run(main, what, namesrv)
    sent, failed = tally.sent, tally.failed
    if txn_ids:
        click.echo(transaction_line(decision, txn_ids, group), err=True)
    if first_failure is not None and not sent:
        raise first_failure  # nothing went: the reason is the whole story
    if first_failure is not None:
        raise CommandError(f"{failed:,} of {count:,} sends to topic {topic!r} failed; the first",
                           first_failure.address, first_failure.why)
