"""``txbroker consume`` commits only what it handed on: a line written and flushed to stdout.

The command runs as a real subprocess writing into a real pipe, and the group's committed
offset is read back through the broker (BROKER_STATUS) and by a second ``consume`` run, which
must start at the first message the first run did not print.
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import sys

import orjson
import pytest
from support.cli_runner import cli_ok, default_sigint, run_cli

from txbroker.client import Consumer, Message, Producer
from txbroker.client.admin import AdminClient

#: Exit status of a command whose output pipe was closed (128 + SIGPIPE, as ``yes | head``).
EXIT_PIPE = 128 + signal.SIGPIPE
SUMMARY_RE = re.compile(r"^consumed (\d+) messages? of topic ")


async def _topic_with(namesrv: str, topic: str, count: int) -> None:
    """One queue, so queue offsets are the order of the lines."""
    async with AdminClient(namesrv) as admin:
        await admin.create_topic(topic, 1)
    async with Producer("PG_ACK", namesrv) as producer:
        for i in range(count):
            await producer.send(Message(topic, f"m{i}".encode()))


async def _committed(namesrv: str, group: str, topic: str) -> int | None:
    """The group's committed offset of queue 0, as the broker reports it."""
    async with AdminClient(namesrv) as admin:
        [doc] = (await admin.status()).values()
    offsets = doc["consumerGroups"].get(group, {}).get("offsets", {}).get(topic, {})
    return offsets.get("0")


def _consume_argv(namesrv: str, topic: str, group: str, *extra: str) -> list[str]:
    return [sys.executable, "-P", "-m", "txbroker", "consume", "--topic", topic, "--group", group,
            "--from-beginning", "--namesrv", namesrv, *extra]


def _printed(err: str) -> int:
    """The count of the command's stderr summary line (messages it printed)."""
    [count] = [int(m.group(1)) for line in err.splitlines() if (m := SUMMARY_RE.match(line))]
    return count


async def _next_offset(namesrv: str, topic: str, group: str) -> int:
    """Queue offset of the first message a second run of the group gets."""
    out = cli_ok(await run_cli("consume", "--topic", topic, "--group", group, "--max", "1",
                               "--json", "--timeout", "10", "--namesrv", namesrv))
    return orjson.loads(out)["queue_offset"]


def _assert_quiet(err: str) -> None:
    assert "error" not in err.lower() and "Traceback" not in err and "Broken pipe" not in err, err


@pytest.mark.parametrize("fmt", [(), ("--json",)], ids=["text", "json"])
async def test_head_closing_the_pipe_commits_only_printed_lines(broker, namesrv, fmt) -> None:
    topic, group = "TPipe", "CG_PIPE"
    await _topic_with(namesrv, topic, 40)
    read_end, write_end = os.pipe()
    try:
        consume = await asyncio.create_subprocess_exec(
            *_consume_argv(namesrv, topic, group, *fmt), stdout=write_end,
            stderr=asyncio.subprocess.PIPE)
        head = await asyncio.create_subprocess_exec("head", "-2", stdin=read_end,
                                                    stdout=asyncio.subprocess.PIPE)
    finally:
        os.close(read_end)
        os.close(write_end)
    try:
        shown, _ = await asyncio.wait_for(head.communicate(), 30)
        # A follower learns that its reader left only on its next write (as `tail -f | head`
        # does): if every line fit in the pipe before head exited (a slow head on a busy
        # machine), that write needs one more message.
        async with Producer("PG_ACK", namesrv) as producer:
            await producer.send(Message(topic, b"one more"))
        _, err_bytes = await asyncio.wait_for(consume.communicate(), 30)
    finally:
        for proc in (consume, head):
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
    err = err_bytes.decode()
    assert len(shown.splitlines()) == 2, err
    printed = _printed(err)
    assert printed >= 2, err
    # Committed up to the last line written, not past the one whose write failed.
    assert await _committed(namesrv, group, topic) == printed
    assert await _next_offset(namesrv, topic, group) == printed
    assert consume.returncode in (0, EXIT_PIPE), (consume.returncode, err)
    _assert_quiet(err)


@pytest.mark.parametrize("fmt", [(), ("--json",)], ids=["text", "json"])
async def test_output_closed_before_the_first_line_commits_nothing(broker, namesrv, fmt) -> None:
    topic, group = "TClosed", "CG_CLOSED"
    await _topic_with(namesrv, topic, 3)
    read_end, write_end = os.pipe()
    os.close(read_end)  # nobody will ever read: the first write fails
    try:
        consume = await asyncio.create_subprocess_exec(
            *_consume_argv(namesrv, topic, group, "--max", "3", *fmt), stdout=write_end,
            stderr=asyncio.subprocess.PIPE)
    finally:
        os.close(write_end)
    try:
        _, err_bytes = await asyncio.wait_for(consume.communicate(), 30)
    finally:
        if consume.returncode is None:
            consume.kill()
            await consume.wait()
    err = err_bytes.decode()
    assert _printed(err) == 0
    assert await _committed(namesrv, group, topic) in (None, 0)
    assert await _next_offset(namesrv, topic, group) == 0
    assert consume.returncode in (0, EXIT_PIPE), (consume.returncode, err)
    _assert_quiet(err)


@pytest.mark.parametrize("fmt", [(), ("--json",)], ids=["text", "json"])
async def test_max_commits_exactly_the_printed_messages(broker, namesrv, fmt) -> None:
    topic, group = "TMax", "CG_MAX"
    await _topic_with(namesrv, topic, 5)
    out = cli_ok(await run_cli("consume", "--topic", topic, "--group", group, "--from-beginning",
                               "--max", "3", "--timeout", "10", *fmt, "--namesrv", namesrv))
    assert len(out.splitlines()) == 3
    assert await _committed(namesrv, group, topic) == 3
    assert await _next_offset(namesrv, topic, group) == 3


async def test_ctrl_c_commits_the_printed_messages(broker, namesrv) -> None:
    topic, group = "TInt", "CG_INT"
    await _topic_with(namesrv, topic, 4)
    consume = await asyncio.create_subprocess_exec(
        *_consume_argv(namesrv, topic, group), stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE, preexec_fn=default_sigint)
    try:
        first = await asyncio.wait_for(consume.stdout.readline(), 30)
        assert first.decode().rstrip().endswith("m0")
        consume.send_signal(signal.SIGINT)
        rest, err_bytes = await asyncio.wait_for(consume.communicate(), 30)
    finally:
        if consume.returncode is None:
            consume.kill()
            await consume.wait()
    err = err_bytes.decode()
    assert consume.returncode == 128 + signal.SIGINT and "Traceback" not in err, err
    printed = 1 + len(rest.splitlines())
    assert _printed(err) == printed
    assert await _committed(namesrv, group, topic) == printed
    if printed < 4:
        assert await _next_offset(namesrv, topic, group) == printed


async def test_sdk_cancelled_handler_leaves_its_message_uncommitted(broker, namesrv) -> None:
    """The SDK's side of Ctrl-C: a task cancelled while it handles a message commits the
    messages it finished and not that one."""
    topic, group = "TCancel", "CG_CANCEL"
    await _topic_with(namesrv, topic, 3)
    finished: list[int] = []
    handling = asyncio.Event()

    async def handle_all() -> None:
        consumer = Consumer(group, namesrv, from_where="first", long_poll_timeout=1.0)
        consumer.subscribe(topic)
        async with consumer:
            async for msg in consumer:
                if msg.queue_offset == 1:
                    handling.set()
                    await asyncio.Event().wait()  # still handling when the cancel comes
                finished.append(msg.queue_offset)

    task = asyncio.create_task(handle_all())
    try:
        await asyncio.wait_for(handling.wait(), 30)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    assert finished == [0]
    assert await _committed(namesrv, group, topic) == 1
    assert await _next_offset(namesrv, topic, group) == 1


#: A reader that takes exactly two lines from its stdin, byte by byte, echoes them and exits:
#: unlike ``head``, it leaves every later byte in the pipe, so which messages it read is known.
TWO_LINES = ("import os, sys\n"
             "got = b''\n"
             "while got.count(b'\\n') < 2:\n"
             "    b = os.read(0, 1)\n"
             "    if not b:\n"
             "        break\n"
             "    got += b\n"
             "sys.stdout.buffer.write(got)\n")


async def _consume_into_two_line_reader(namesrv: str, topic: str, group: str,
                                        *extra: str) -> tuple[bytes, str, int, float]:
    """Run ``consume`` into a reader of two lines; its output, the command's stderr, exit
    status, and seconds from the reader's exit to the command's."""
    read_end, write_end = os.pipe()
    try:
        consume = await asyncio.create_subprocess_exec(
            *_consume_argv(namesrv, topic, group, *extra), stdout=write_end,
            stderr=asyncio.subprocess.PIPE)
        reader = await asyncio.create_subprocess_exec(sys.executable, "-c", TWO_LINES,
                                                      stdin=read_end, stdout=asyncio.subprocess.PIPE)
    finally:
        os.close(read_end)
        os.close(write_end)
    try:
        shown, _ = await asyncio.wait_for(reader.communicate(), 30)
        loop = asyncio.get_running_loop()
        reader_done = loop.time()
        _, err_bytes = await asyncio.wait_for(consume.communicate(), 30)
        lag = loop.time() - reader_done
    finally:
        for proc in (consume, reader):
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
    return shown, err_bytes.decode(), consume.returncode, lag


@pytest.mark.parametrize("extra", [(), ("--max", "5")], ids=["follow", "max"])
async def test_lines_left_in_the_pipe_are_not_committed(broker, namesrv, extra) -> None:
    """The reader takes two lines and leaves: the command ends within seconds, with no new
    message to write, and the group's next run starts at the first line not read."""
    topic, group = f"TUnread{len(extra)}", f"CG_UNREAD{len(extra)}"
    await _topic_with(namesrv, topic, 10)
    shown, err, status, lag = await _consume_into_two_line_reader(namesrv, topic, group, *extra)
    assert shown.decode().splitlines()[1].endswith("m1"), shown
    assert lag < 5, (lag, err)
    assert status == EXIT_PIPE, (status, err)
    _assert_quiet(err)
    assert _printed(err) == 2, err
    assert await _committed(namesrv, group, topic) == 2
    assert await _next_offset(namesrv, topic, group) == 2
