"""``txbroker consume``: print messages of a topic as a member of a consumer group.

Offsets are committed for the group, so a second run continues where the first stopped.  A
message counts as consumed once its line is written to stdout, never before: one whose write
failed, or that Ctrl-C interrupted before it was written, is delivered again to the group.  A
closed stdout (``consume | head``) ends the command with status 141 and no error, like other
command-line tools.  Stop with Ctrl-C, ``--max`` or ``--idle-timeout``.

When stdout is a pipe, a line written is not yet a line read: the reader may exit with lines
still in the pipe (``head -2`` leaves the rest there).  So the command commits a message only
once the reader has taken all of its line from the pipe: it counts the bytes it wrote, asks
the kernel how many of them are still unread (FIONREAD on the write end), and acknowledges
every message whose line ends at or before the difference.  It notices a reader that has gone
(poll() reports POLLERR on the write end) between messages and every ``READER_CHECK`` seconds
while idle, so ``consume | head -2`` ends at once, not at the next message.  At the end it
waits up to ``DRAIN_TIMEOUT`` seconds for the reader to take what is still in the pipe.  With
``--max`` the idle time-out defaults to 5 s, so asking for more messages than the topic holds
ends instead of waiting forever; without it the command follows the topic until stopped.
"""

from __future__ import annotations

import asyncio
import base64
import fcntl
import os
import select
import signal
import stat
import struct
import sys
import termios
from collections import deque
from collections.abc import Callable

import click
import orjson

from txbroker.cli.common import credentials_options, namesrv_option, run
from txbroker.client import Consumer, MessageExt
from txbroker.client.errors import BrokerError

#: Idle seconds after which a ``--max`` run stops short of its count.
MAX_IDLE_DEFAULT = 5.0
#: Exit status when stdout's reader has gone: 128 + SIGPIPE, what ``yes | head`` reports.
EXIT_OUTPUT_CLOSED = 128 + signal.SIGPIPE
#: Seconds between checks that a pipe's reader is still there while no message arrives.
READER_CHECK = 0.2
#: Seconds the command waits at its end for the reader to take the lines still in the pipe;
#: lines it has not taken by then are not committed and go to the group again.
DRAIN_TIMEOUT = 10.0


class PipeOutput:
    """stdout as a pipe: which written messages its reader has taken.

    ``written`` counts the bytes handed to the pipe; each message's acknowledgement waits in
    ``pending`` with the byte count at which its line ends, until the pipe's unread bytes
    (FIONREAD) show that the reader is past that point.
    """

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.written = 0
        self.taken = 0
        self.pending: deque[tuple[int, Callable[[], None]]] = deque()
        #: The reader has gone and stdout now points at the null device: nothing to count.
        self.closed = False
        self._poll = select.poll()
        self._poll.register(fd, 0)  # POLLERR and POLLHUP are reported whatever is asked

    @classmethod
    def of_stdout(cls) -> PipeOutput | None:
        """The tracker for stdout if it is a pipe (None for a file, a terminal or a socket)."""
        try:
            fd = sys.stdout.fileno()
            return cls(fd) if stat.S_ISFIFO(os.fstat(fd).st_mode) else None
        except (AttributeError, OSError, ValueError):
            return None  # not a file descriptor (an in-memory stream)

    def write(self, line: str, ack: Callable[[], None]) -> None:
        """Write ``line`` and a newline, flushed; BrokenPipeError if the reader has gone."""
        data = (line + "\n").encode()
        sys.stdout.flush()  # nothing of ours is buffered there, but keep the order if it is
        sys.stdout.buffer.write(data)
        sys.stdout.buffer.flush()
        self.written += len(data)
        self.pending.append((self.written, ack))

    def reader_gone(self) -> bool:
        return any(ev & select.POLLERR for _, ev in self._poll.poll(0))

    def unread(self) -> int:
        buf = fcntl.ioctl(self.fd, termios.FIONREAD, b"\0\0\0\0")
        return struct.unpack("i", buf)[0]

    def settle(self) -> None:
        """Acknowledge every message whose line the reader has wholly taken."""
        if not self.pending:
            return
        read = self.written - self.unread()
        pending = self.pending
        while pending and pending[0][0] <= read:
            pending.popleft()[1]()
            self.taken += 1

    def close(self) -> None:
        """The reader has gone: acknowledge what it took before it left, count nothing more.

        The pipe keeps its unread bytes while we hold the write end, so FIONREAD still tells
        how far the reader got.
        """
        self.settle()
        self.pending.clear()
        self.closed = True
        _discard_stdout()

    async def drain(self, timeout: float) -> bool:
        """Wait (up to ``timeout`` s) until the reader has taken everything or gone, then settle.

        True if the reader went away leaving lines unread (the output was closed on us).
        """
        if self.closed:
            return False
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while self.pending and loop.time() < deadline:
            if self.reader_gone():
                self.close()
                return True
            self.settle()
            if self.pending:
                await asyncio.sleep(0.02)
        self.settle()
        return False


class ReaderGone(Exception):
    """The reader of stdout's pipe has closed it."""


async def _next(consumer: Consumer, timeout: float | None,
                output: PipeOutput | None) -> MessageExt | None:
    """``consumer.poll(timeout)``, checking every ``READER_CHECK`` s while waiting (and, on a
    pipe, between messages) that the reader is still there and the broker does not refuse.

    Raises :class:`ReaderGone`, or the broker's lasting refusal of every pull (no SUB right,
    no such topic on the broker), which the consumer itself would retry forever.
    """
    loop = asyncio.get_running_loop()
    deadline = None if timeout is None else loop.time() + timeout
    while True:
        if output is not None:
            if output.reader_gone():
                raise ReaderGone
            output.settle()
        refusal = consumer.refusal()
        if refusal is not None:
            raise refusal
        wait = READER_CHECK if deadline is None else min(READER_CHECK, deadline - loop.time())
        if wait <= 0:
            return None
        msg = await consumer.poll(wait)
        if msg is not None:
            return msg


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
        output = PipeOutput.of_stdout()
        # Whether the message poll() last returned was printed.  poll() acknowledges the one
        # before it, which was; shutdown acknowledges the last one only if it was printed, so
        # a failed write or a cancellation before the write leaves it to be delivered again.
        # On a pipe every message's acknowledgement is deferred until its line is read.
        printed = False
        try:
            while max_count is None or count < max_count:
                try:
                    msg = await _next(consumer, timeout, output)
                except ReaderGone:
                    assert output is not None
                    why = "output closed"
                    output.close()
                    break
                except BrokerError:
                    why = ""  # the error line says it all: no summary
                    raise
                printed = False
                if msg is None:
                    why = f"no new message for {timeout:g} s"
                    break
                line = orjson.dumps(_doc(msg)).decode() if as_json else _text(msg)
                try:
                    if output is None:
                        click.echo(line)
                    else:
                        output.write(line, consumer.defer_ack())
                except BrokenPipeError:
                    why = "output closed"
                    if output is None:
                        _discard_stdout()
                    else:
                        output.close()
                    break
                printed = True
                count += 1
            else:
                why = f"--max {max_count} reached"
        finally:
            if output is not None:
                if await output.drain(DRAIN_TIMEOUT) and why:
                    why = "output closed"
                count = output.taken
            await consumer.shutdown(ack_delivered=printed and output is None)
            if why:
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
