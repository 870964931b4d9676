"""``txbroker produce``: send messages, plain or transactional, from the command line.

With ``--transactional`` each message is sent as a half message and the "local transaction" is
the ``--decision`` given: ``commit`` makes it visible, ``rollback`` discards it, ``unknown``
leaves it pending so the broker checks back (this command answers UNKNOW again while it runs;
an operator can then resolve it with ``txbroker txn commit|rollback``).
"""

from __future__ import annotations

import sys
from pathlib import Path

import click
import orjson

from cli.common import credentials_options, namesrv_option, run
from txbroker.client import (
    LocalTransactionState,
    Message,
    MessageExt,
    Producer,
    SendResult,
    TransactionListener,
    TransactionProducer,
)

DECISIONS = {
    "commit": LocalTransactionState.COMMIT_MESSAGE,
    "rollback": LocalTransactionState.ROLLBACK_MESSAGE,
    "unknown": LocalTransactionState.UNKNOW,
}


class _FixedDecision(TransactionListener):
    """The CLI's local transaction: the decision given on the command line."""

    def __init__(self, state: LocalTransactionState) -> None:
        self.state = state

    def execute_local_transaction(self, msg: MessageExt, arg: object) -> LocalTransactionState:
        return self.state

    def check_local_transaction(self, msg: MessageExt) -> LocalTransactionState:
        # This process keeps no durable state, so it cannot know better than "unknown".
        return LocalTransactionState.UNKNOW


def _line(result: SendResult, as_json: bool) -> str:
    doc = {"status": result.send_status.name, "msg_id": result.msg_id,
           "offset_msg_id": result.offset_msg_id, "topic": result.topic,
           "queue_id": result.queue_id, "queue_offset": result.queue_offset}
    state = getattr(result, "local_transaction_state", None)
    if state is not None:
        doc["transaction_id"] = result.transaction_id  # type: ignore[attr-defined]
        doc["local_transaction_state"] = state.name
    if as_json:
        return orjson.dumps(doc).decode()
    return " ".join(f"{k}={v}" for k, v in doc.items())


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
@click.option("--json", "as_json", is_flag=True, help="One JSON object per sent message.")
@click.option("--timeout", default=3.0, show_default=True, type=click.FloatRange(0.1, 600),
              help="Send timeout in seconds.")
@namesrv_option
@credentials_options
def produce(topic: str, body: str | None, path: str | None, keys: str | None, tags: str | None,
            properties: tuple[str, ...], count: int, group: str, transactional: bool,
            decision: str, as_json: bool, timeout: float, namesrv: str, credentials: dict[str, str]) -> None:
    """Send a message (or --count of them) to TOPIC."""
    if (body is None) == (path is None):
        raise click.UsageError("give exactly one of --body or --file")
    if not transactional and decision != "commit":
        raise click.UsageError("--decision needs --transactional")
    if path is not None:
        try:
            data = sys.stdin.buffer.read() if path == "-" else Path(path).read_bytes()
        except OSError as exc:
            raise click.ClickException(f"cannot read {path}: {exc.strerror or exc}") from None
    else:
        data = body.encode()
    props = {}
    for item in properties:
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise click.UsageError(f"--property {item!r}: expected NAME=VALUE")
        props[name] = value

    async def main() -> None:
        if transactional:
            producer = TransactionProducer(group, namesrv, listener=_FixedDecision(DECISIONS[decision]),
                                           send_timeout=timeout, **credentials)
        else:
            producer = Producer(group, namesrv, send_timeout=timeout, **credentials)
        msg = Message(topic, data, tags=tags, keys=keys, properties=props or None)
        msg.validate(producer.max_message_size)
        async with producer:
            for _ in range(count):
                if transactional:
                    result = await producer.send_message_in_transaction(msg)
                else:
                    result = await producer.send(msg)
                click.echo(_line(result, as_json))

    run(main)
