"""Running the ``txbroker`` click commands in-process against a live broker.

Each command runs its own event loop in a worker thread (cli.common.run), so the runner is
called through ``asyncio.to_thread`` and the broker keeps serving on the test's loop meanwhile.
"""

from __future__ import annotations

import asyncio
import signal

from click.testing import CliRunner, Result

from txbroker.cli.main import main


async def run_cli(*args: str, env: dict[str, str] | None = None, input: bytes | None = None) -> Result:
    runner = CliRunner()
    return await asyncio.to_thread(runner.invoke, main, list(args), env=env, input=input,
                                   catch_exceptions=False)


def cli_ok(result: Result) -> str:
    """The command's stdout, after asserting it succeeded."""
    assert result.exit_code == 0, (result.exit_code, result.output, result.stderr)
    return result.stdout


def cli_one_line_error(result: Result) -> str:
    """The command's error line, after asserting it failed with exactly one line, no traceback."""
    assert result.exit_code == 1, (result.exit_code, result.output)
    err = result.stderr.strip()
    assert err.startswith("error: ") and "\n" not in err and "Traceback" not in result.output
    return err


def default_sigint() -> None:
    """``preexec_fn`` of a command a test stops with SIGINT, as Ctrl-C stops it in a terminal.

    A process started in the background of a non-interactive shell (``cmd &``, as a CI runner
    may start the suite) has SIGINT ignored, and its children inherit that: Python then keeps
    ignoring SIGINT, and the command would never see the test's Ctrl-C.
    """
    signal.signal(signal.SIGINT, signal.SIG_DFL)
