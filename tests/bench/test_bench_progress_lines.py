"""Plain progress lines for a console that is not a terminal (a log file, a pipe, CI): rich
draws its bars there only once, at the end, so an hour-long phase would print nothing."""

from __future__ import annotations

import io
import time

from rich.console import Console
from rich.progress import Progress

from txbroker.bench.trace.run import progress_lines


def test_a_running_bar_gives_a_line_with_rate_and_time_left() -> None:
    console = Console(file=io.StringIO(), force_terminal=False)
    assert not console.is_terminal
    with Progress(console=console) as progress:
        replay = progress.add_task("replay-rocketmq", total=10_000_000)
        progress.add_task("generate", total=1, completed=1)  # finished: no line
        progress.add_task("deliveries", total=None)           # no total yet: no line
        progress.update(replay, completed=1_000)
        time.sleep(0.2)
        progress.update(replay, completed=2_000_000)
        [line] = progress_lines(progress)
    assert line.startswith("replay-rocketmq: 2,000,000 / 10,000,000, ")
    assert "/s, about " in line and line.endswith(" left")


def test_no_line_once_every_bar_is_finished() -> None:
    with Progress(console=Console(file=io.StringIO(), force_terminal=False)) as progress:
        task = progress.add_task("verify-kafka", total=3)
        progress.update(task, completed=3)
        assert progress_lines(progress) == []
