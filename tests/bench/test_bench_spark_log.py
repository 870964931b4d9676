"""``bench generate`` as an operator runs it, in its own process (the JVM is started by the
command, not shared with the other bench tests): the timing line counts the Spark start-up,
and Spark's own output goes to the log file the command names, not to the terminal."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

#: What Spark prints on a terminal left to it: the JVM's banner, log4j's profile notice and
#: level hint, log4j lines (``26/11/23 15:02:19 WARN NativeCodeLoader: …``), progress bars.
SPARK_CHATTER = re.compile(r"WARNING: Using incubator|log4j|setLogLevel|\b(WARN|INFO)\b|\[Stage \d")


@pytest.mark.slow  # starts its own Spark JVM
def test_generate_reports_wall_time_and_sends_spark_output_to_its_log(tmp_path):
    out = tmp_path / "trace"
    run = subprocess.run(
        [sys.executable, "-P", "-m", "txbroker", "bench", "generate",
         "--transactions", "50", "--out", str(out), "--master", "local[1]"],
        capture_output=True, text=True, timeout=240, check=False)
    assert run.returncode == 0, (run.stdout, run.stderr)
    m = re.fullmatch(r"wrote 50 transactions to (\S+) in (\d+\.\d) s "
                     r"\((\d+\.\d) s wall, including (\d+\.\d) s Spark start-up\)\n", run.stdout)
    assert m, run.stdout
    generate_s, wall_s, startup_s = map(float, m.group(2, 3, 4))
    assert m.group(1) == str(out)
    # each figure is rounded to 0.1 s, so the sum may exceed the wall time by up to 0.15 s
    assert startup_s > 0 and wall_s + 0.2 >= generate_s + startup_s
    log = tmp_path / "trace.spark.log"
    assert run.stderr == f"Spark log: {log} (--verbose shows it here)\n"
    assert not SPARK_CHATTER.search(run.stdout + run.stderr)
    text = log.read_text()
    assert "INFO SparkContext: Running Spark version" in text
    assert re.search(r"INFO (DAGScheduler|SparkContext): Job 0 finished", text), text[-2000:]
    assert list(out.glob("*.parquet")) and not (out / "trace.spark.log").exists()
