"""The README's quick-start broker and its "Running a cluster" section, run as written.

The cluster section starts seven background processes, runs client commands against them,
kills a master, restarts it and stops everything; its ``sh`` blocks run here as one bash
script (its background jobs and exports carry from line to line, as in the reader's shell)
from a scratch checkout.  Only the port numbers differ: each port the section names is mapped
to a free one (a broker port to one whose successor, the replication port, is free too), so
the test never collides with anything listening on the machine.  Every process the script
starts is in the test's own process group and is killed at the end, whatever happened.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from test_readme import README, commands, scratch_checkout

#: Bound on the whole cluster script (it sleeps ~20 s by design).
SCRIPT_TIMEOUT = 180
MARK = "@@readme-line@@"
#: The script's last line: the TXBROKER_* variables the section left set in the reader's shell.
LEFT_SET = f"echo \"{MARK} left set: $(env | grep -o '^TXBROKER_[A-Z_]*' | tr '\\n' ' ')\""


def _free_port(pair: bool, taken: set[int]) -> int:
    """A free loopback port (and, with ``pair``, its successor free too) not handed out yet."""
    for _ in range(200):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        wanted = [port, port + 1] if pair else [port]
        if port + 1 > 65535 or taken & set(wanted) or (pair and not _bindable(port + 1)):
            continue
        taken.update(wanted)
        return port
    raise RuntimeError("no free loopback port pair")


def _bindable(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _disk_use(root: Path) -> int:
    """Bytes of disk blocks allocated under ``root`` (preallocated segments count in full)."""
    return sum(p.stat().st_blocks * 512 for p in root.rglob("*") if p.is_file())


def _environment() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TXBROKER_")}
    env.pop("VIRTUAL_ENV", None)
    env["PATH"] = "/usr/bin:/bin"  # nothing of the venv on PATH: the README must say where
    return env


def _results(output: str, lines: list[str]) -> tuple[dict[str, str], dict[str, str]]:
    """Each command's own output (its stdout and stderr up to the next marker) and, apart,
    the commands that exited non-zero with theirs: a failure message names the command
    instead of repeating the whole script's output, which is long."""
    per_line: dict[str, str] = {}
    failed: dict[str, str] = {}
    current = None
    for chunk in output.split(f"{MARK} ")[1:]:
        head, _, rest = chunk.partition("\n")
        if head.isdigit():
            current = lines[int(head)]
            per_line[current] = per_line.get(current, "") + rest
        elif head.startswith("rc ") and head != "rc 0" and current is not None:
            failed[current] = f"exit {head[3:]}\n{per_line[current]}{rest}"
    return per_line, failed


def _failures(failed: dict[str, str]) -> str:
    return "\n".join(f"$ {line}\n{text}" for line, text in failed.items())


@pytest.mark.slow
def test_quick_start_broker_is_small_on_disk(tmp_path):
    """The quick start's serve command (after its install steps) from a fresh checkout: ready,
    its data in ./txbroker-data, and well under the 1-2 GiB a default segment would take."""
    text = README.read_text()
    block = text[text.index("<!-- serve-command -->"):]
    line = re.search(r"```sh\n(.*?)\n```", block, re.DOTALL).group(1)
    serve = line.split(" && ")[-1]
    assert serve.startswith(".venv/bin/txbroker serve"), line
    cwd = scratch_checkout(tmp_path)
    port, namesrv = _free_port(True, set()), _free_port(False, set())
    proc = subprocess.Popen(["bash", "-c", f"exec {serve} --broker-port {port} --namesrv-port {namesrv}"],
                            cwd=cwd, env=_environment(), stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True, start_new_session=True)
    try:
        ready = proc.stdout.readline()
        assert ready.startswith(f"txbroker ready broker=127.0.0.1:{port}"), ready
        sent = subprocess.run([sys.executable, "-P", "-m", "txbroker", "produce", "--topic", "Q",
                               "--body", "x", "--namesrv", f"127.0.0.1:{namesrv}"],
                              capture_output=True, text=True, timeout=60, env=_environment(), check=False)
        assert sent.returncode == 0, sent.stderr
        used = _disk_use(cwd / "txbroker-data")
        assert 64 << 20 <= used <= 200 << 20, used  # two 64 MiB segments, not 2 GiB
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(30)


@pytest.mark.slow
def test_readme_cluster_section_runs_as_written(tmp_path):
    lines = commands("## Running a cluster")
    assert any(" serve " in line and line.rstrip().endswith("&") for line in lines)
    taken: set[int] = set()
    mapping: dict[str, str] = {}
    for port in sorted({int(p) for line in lines for p in re.findall(r"\b(\d{4,5})\b", line)}):
        if 1024 < port < 65536:
            is_broker = any(f"--broker-port {port}" in line for line in lines)
            mapping[str(port)] = str(_free_port(is_broker, taken))
    script = ["set -u"]
    for n, line in enumerate(lines):
        mapped = re.sub(r"\b(\d{4,5})\b", lambda m: mapping.get(m.group(1), m.group(1)), line)
        script += [f"echo '{MARK} {n}'; echo '{MARK} {n}' >&2", mapped,
                   f"rc=$?; echo \"{MARK} rc $rc\" >&2",
                   # The cluster's logs, read before the last line removes them, where a
                   # command failed: what the brokers said then.
                   "[ $rc = 0 ] || tail -n 40 cluster-demo/*.log >&2",
                   f"echo \"{MARK} du $(du -sk cluster-demo 2>/dev/null | cut -f1)\" >&2"]
    script.append(LEFT_SET)
    cwd = scratch_checkout(tmp_path)
    (cwd / "readme-cluster.sh").write_text("\n".join(script) + "\n")
    proc = subprocess.Popen(["bash", "readme-cluster.sh"], cwd=cwd, env=_environment(),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        output, _ = proc.communicate(timeout=SCRIPT_TIMEOUT)
    finally:
        with contextlib.suppress(ProcessLookupError):  # the group is gone when all stopped
            os.killpg(proc.pid, signal.SIGKILL)  # anything the script left running
        proc.wait(10)
    assert proc.returncode == 0, output
    per_line, failed = _results(output, lines)
    assert not failed, _failures(failed)

    def out(fragment: str, nth: int = 0) -> str:
        matching = [per_line[line] for line in lines if fragment in line]
        assert len(matching) > nth, (fragment, lines)
        return matching[nth]

    assert "created on 2 of 2" in out("topic create"), output
    assert "sent 8" in out("produce"), output
    assert "consumed 8 messages" in out("consume"), output
    assert "sent 8" in out("produce", 1), output  # with an etcd member killed just before
    # The topic made just before broker-a's master died: every message, from both groups.
    assert "consumed 4 messages" in out("consume --topic Fresh"), output
    before = out("txbroker status", 0)
    assert "4 of 4 broker(s) reachable in 2 group(s)" in before, before
    master, old = (f"broker-a@127.0.0.1:{mapping[p]}" for p in ("10921", "10911"))
    after = out("txbroker status", 1)
    assert f"group broker-a: master {master}, epoch 2" in after, after
    assert re.search(rf"broker {old}  down since .*connection closed", after), after
    rejoined = out("txbroker status", 2)
    assert f"broker {old} (slave, epoch 2)" in rejoined, rejoined
    kib = [int(k) for k in re.findall(rf"{MARK} du (\d+)", output)]
    # Small preallocated broker files: the demo stays small (etcd's write-ahead logs, 128 MB
    # preallocated per member, are most of it).
    assert kib and max(kib) < 550 * 1024, max(kib)
    assert not (cwd / "cluster-demo").exists()  # the last block removes the demo's files
    # ... and unsets what it exported: a later section's serve would read them
    assert f"{MARK} left set: \n" in output, output[-2000:]


@pytest.mark.slow
def test_readme_secure_cluster_runs_as_written(tmp_path):
    """The "Secure cluster" variant as written (ports mapped to free ones): etcd, a name
    server and one group of two brokers, every port TLS enforcing with mTLS (etcd's too) and
    the cluster secret; produce and consume over TLS, the master killed and its slave elected
    on etcd over TLS, and what was acknowledged before the kill, on a topic made just before,
    read from the new master."""
    lines: list[str] = []
    for line in commands("## Secure cluster"):  # a quoted argument over several lines is one
        if lines and lines[-1].count('"') % 2 == 1:
            lines[-1] += "\n" + line
        else:
            lines.append(line)
    assert any("TXBROKER_TLS_MODE=enforcing" in line for line in lines)
    taken: set[int] = set()
    mapping: dict[str, str] = {}
    for port in sorted({int(p) for line in lines for p in re.findall(r"\b(\d{4,5})\b", line)}):
        if 1024 < port < 65536:
            is_broker = any(f"--broker-port {port}" in line for line in lines)
            mapping[str(port)] = str(_free_port(is_broker, taken))
    script = ["set -u"]
    for n, line in enumerate(lines):
        mapped = re.sub(r"\b(\d{4,5})\b", lambda m: mapping.get(m.group(1), m.group(1)), line)
        script += [f"echo '{MARK} {n}'; echo '{MARK} {n}' >&2", mapped,
                   f"echo \"{MARK} rc $?\" >&2"]
    script.append(LEFT_SET)
    cwd = scratch_checkout(tmp_path)
    (cwd / "readme-secure.sh").write_text("\n".join(script) + "\n")
    proc = subprocess.Popen(["bash", "readme-secure.sh"], cwd=cwd, env=_environment(),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        output, _ = proc.communicate(timeout=SCRIPT_TIMEOUT)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)
    assert proc.returncode == 0, output
    per_line, failed = _results(output, lines)
    assert not failed, _failures(failed)

    def out(fragment: str) -> str:
        matching = [per_line[line] for line in lines if fragment in line and line in per_line]
        assert matching, (fragment, lines)
        return matching[0]

    assert "created on 1 of 1" in out("topic create"), output
    assert "sent 4" in out("produce"), output
    master = f"broker-s@127.0.0.1:{mapping['10951']}"
    assert f"group broker-s: master {master}, epoch 1" in out("txbroker status"), output
    assert "consumed 4 messages" in out("consume"), output
    assert not (cwd / "secure-demo").exists()
    assert f"{MARK} left set: \n" in output, output[-2000:]
