"""The README's command-line and example commands run as written, in order, against a real broker.

Every line of the fenced ``sh`` blocks under "### Command line" and "## Example" is run with
bash from a scratch directory that looks like a checkout after the quick start: ``.venv`` is the
virtual environment running this test and ``examples`` the repository's.  Only the name-server
address differs (``TXBROKER_NAMESRV`` points at a broker on ephemeral ports), and ``<id>`` is the
transaction id an earlier command printed, as a reader would fill it in.  A command that fails,
hangs past its bound or needs an activated virtual environment fails this test.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
#: Bound on one command; the example's check-back step runs for 20 s by design.
COMMAND_TIMEOUT = 60


def section(heading: str) -> str:
    """The README text under ``heading`` up to the next heading of the same or a higher level."""
    text = README.read_text()
    level = heading.split(" ", 1)[0]
    start = text.index(heading + "\n")
    rest = text[start + len(heading) + 1:]
    ends = [m.start() for m in re.finditer(rf"^#{{1,{len(level)}}} ", rest, re.MULTILINE)]
    return rest[:ends[0]] if ends else rest


def commands(heading: str) -> list[str]:
    """The command lines of the ``sh`` blocks in one section, in order."""
    out: list[str] = []
    for block in re.findall(r"```sh\n(.*?)```", section(heading), re.DOTALL):
        out += [line for line in block.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    return out


def scratch_checkout(tmp_path: Path) -> Path:
    """A directory where ``.venv/bin/...`` and ``examples/...`` resolve as in a checkout."""
    cwd = tmp_path / "checkout"
    cwd.mkdir()
    (cwd / ".venv").symlink_to(Path(sys.prefix), target_is_directory=True)
    (cwd / "examples").symlink_to(REPO / "examples", target_is_directory=True)
    return cwd


def run_in_order(lines: list[str], cwd: Path, namesrv: str) -> list[tuple[str, str]]:
    """Runs each line; returns (line, combined output) per line.  ``<id>`` is the last
    transaction id printed before it."""
    env = {**os.environ, "TXBROKER_NAMESRV": namesrv, "USER": "readme-test"}
    env.pop("VIRTUAL_ENV", None)
    env["PATH"] = "/usr/bin:/bin"  # nothing of the venv on PATH: the README must say where
    results: list[tuple[str, str]] = []
    tx_id = None
    for line in lines:
        if "<id>" in line:
            assert tx_id is not None, f"{line!r} needs a transaction id no earlier command printed"
            line = line.replace("<id>", tx_id)
        proc = subprocess.run(["bash", "-c", line], check=False, cwd=cwd, env=env, capture_output=True,
                              text=True, timeout=COMMAND_TIMEOUT, stdin=subprocess.DEVNULL)
        output = proc.stdout + proc.stderr
        assert proc.returncode == 0, f"README command failed ({proc.returncode}): {line}\n{output}"
        m = re.search(r"transaction (\S+) left unknown", output)
        if m:
            tx_id = m.group(1)
        results.append((line, output))
    return results


@pytest.mark.slow
def test_readme_command_line_section_runs_as_written(broker_process, tmp_path):
    lines = commands("### Command line")
    assert len(lines) >= 8
    assert all(line.startswith((".venv/bin/", "echo ")) for line in lines), lines
    broker = broker_process()
    results = run_in_order(lines, scratch_checkout(tmp_path), broker.namesrv_addr)
    outputs = dict(results)
    consumed = [out for line, out in results if " consume " in line]
    # three plain messages and the transactional one, once committed by its id
    assert consumed and "consumed 4 messages" in consumed[0], consumed
    assert any("already" not in out and "committed" in out for line, out in outputs.items()
               if " txn commit " in line)


@pytest.mark.slow
def test_readme_example_section_runs_as_written(broker_process, tmp_path):
    text = section("## Example")
    m = re.search(r"txbroker serve --segment-size \S+ --transaction-check-interval (\d+)", text)
    assert m, "the example section names the check interval its broker runs with"
    broker = broker_process(transaction_check_interval=int(m.group(1)))
    lines = commands("## Example")
    assert all(line.startswith(".venv/bin/python examples/") for line in lines), lines
    cwd = scratch_checkout(tmp_path)
    results = run_in_order(lines, cwd, broker.namesrv_addr)
    placed = {}  # item -> order id, from what each ``place`` printed
    for line, out in results:
        if " place " in line:
            item = re.search(r"--item (\S+)", line).group(1)
            placed[item] = json.loads(out.splitlines()[0])["order_id"]
    applied = {json.loads(row)["applied"] for row in results[-1][1].splitlines() if row.startswith("{")}
    assert applied == {placed["book"], placed["desk"]}, (placed, applied)  # never the lamp
    assert (cwd / ".example-data" / "orders.db").exists()
