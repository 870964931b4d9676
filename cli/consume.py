"""``txbroker consume``: print messages of a topic as a member of a consumer group.

Offsets are committed for the group, so a second run continues where the first stopped.  A
message counts as consumed once its line is written to stdout, never before: one whose write
failed, or that Ctrl-C interrupted before it was written, is delivered again to the group.  A
closed stdout (``consume | head``) ends the command with status 141 and no error, like other
command-line tools.  Stop with Ctrl-C, ``--max`` or ``--idle-timeout``.  With
``--max`` the idle time-out defaults to 5 s, so asking for more messages than the topic holds
ends instead of waiting forever; without it the command follows the topic until stopped.
"""

from __future__ import annotations

import base64
import os
import signal
import sys

import click
import orjson

from txbroker.cli.common import credentials_options, namesrv_option, run
from txbroker.client import Consumer, MessageExt

#: Idle seconds after which a ``--max`` run stops short of its count.
MAX_IDLE_DEFAULT = 5.0
#: Exit status when stdout's reader has gone: 128 + SIGPIPE, what ``yes | head`` reports.
EXIT_OUTPUT_CLOSED = 128 + signal.SIGPIPE


def _doc(msg: MessageExt) -> dict:
    doc = {"msg_id": msg.msg_id, "offset_msg_id": msg.offset_msg_id, "topic": msg.topic,
           "broker_name": msg.broker_name, "queue_id": msg.queue_id, "queue_offset": msg.queue_offset, "tags": msg.tags,
           "keys": msg.keys, "born_timestamp": msg.born_timestamp,
           "store_timestamp": msg.store_timestamp, "reconsume_times": msg.reconsume_times,
           "transaction_id": msg.transaction_id,
           "properties": {k: v for k, v in msg.properties.items()
                          if k not in ("UNIQ_KEY", "TAGS", "KEYS")}}
    try:
        doc["body"] = msg.body.decode()
    except UnicodeDecodeError:
        doc["body_base64"] = base64.b64encode(msg.body).decode()
    return doc


def _text(msg: MessageExt) -> str:
    try:
        body = msg.body.decode()
    except UnicodeDecodeError:
        body = "base64:" + base64.b64encode(msg.body).decode()
    # A queue id means something only with its broker group: broker-a and broker-b both
    # have a queue 0 of the topic.
    parts = [msg.msg_id, f"{msg.topic}#{msg.queue_id}@{msg.queue_offset}", f"broker={msg.broker_name}"]
    if msg.tags:
        parts.append(f"tags={msg.tags}")
    if msg.keys:
        parts.append(f"keys={msg.keys}")
    parts.append(repr(body) if "\n" in body else body)
    return " ".join(parts)


@click.command()
@click.option("--topic", required=True, help="Topic to consume.")
@click.option("--group", required=True, help="Consumer group (offsets are kept per group).")
@click.option("--expression", default="*", show_default=True, help="Tag expression, e.g. 'A || B'.")
@click.option("--from-beginning", is_flag=True,
              help="A new group starts at the oldest retained message (default: only new ones).")
@click.option("--max", "max_count", type=click.IntRange(1), help="Stop after this many messages.")
@click.option("--idle-timeout", "--timeout", "idle_timeout", type=click.FloatRange(0.01),
              metavar="SECONDS",
              help=f"Stop after this many seconds without a new message [default: "
                   f"{MAX_IDLE_DEFAULT:g} with --max, else follow until Ctrl-C].")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per message.")
@namesrv_option
@credentials_options
def consume(topic: str, group: str, expression: str, from_beginning: bool, max_count: int | None,
            idle_timeout: float | None, as_json: bool, namesrv: str, credentials: dict[str, str]) -> None:
    """Print messages of TOPIC as they arrive; a summary line goes to stderr at the end."""
    timeout = MAX_IDLE_DEFAULT if idle_timeout is None and max_count is not None else idle_timeout

    async def main() -> None:
        consumer = Consumer(group, namesrv, from_where="first" if from_beginning else "last",
                            long_poll_timeout=min(15.0, timeout) if timeout else 15.0,
                            **credentials)
        consumer.subscribe(topic, expression)
        await consumer.start()
        count, why = 0, "stopped"
        # Whether the message poll() last returned was printed.  poll() acknowledges the one
        # before it, which was; shutdown acknowledges the last one only if it was printed, so
        # a failed write or a cancellation before the write leaves it to be delivered again.
        printed = False
        try:
            while max_count is None or count < max_count:
                msg = await consumer.poll(timeout)
                printed = False
                if msg is None:
                    why = f"no new message for {timeout:g} s"
                    break
                try:
                    click.echo(orjson.dumps(_doc(msg)).decode() if as_json else _text(msg))
                except BrokenPipeError:
                    why = "output closed"
                    _discard_stdout()
                    break
                printed = True
                count += 1
            else:
                why = f"--max {max_count} reached"
        finally:
            await consumer.shutdown(ack_delivered=printed)
            click.echo(f"consumed {count:,} message{'' if count == 1 else 's'} of topic {topic} "
                       f"as group {group} ({why})", err=True)
        if why == "output closed":
            raise click.exceptions.Exit(EXIT_OUTPUT_CLOSED)

    run(main)


def _discard_stdout() -> None:
    """Point stdout at the null device once its reader has gone (``consume | head``).

    The line that failed is still in stdout's buffer, and Python flushes it again at exit,
    which would print a second broken-pipe report after the command has ended cleanly.
    """
    try:
        fd = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):
        return  # not a file descriptor (an in-memory stream): nothing is flushed to a pipe
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, fd)
    finally:
        os.close(devnull)
