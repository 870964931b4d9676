"""``bench run`` options refused before Spark starts (one ``error:`` line each), and the slot
rules of replay + delivery tasks."""

from __future__ import annotations

import os

import pytest
from click.testing import CliRunner

from txbroker.bench.trace.replay import check_slots
from txbroker.bench.trace.spark import local_master
from txbroker.bench.trace.spec import SpecError
from txbroker.cli.main import main


def _error_line(result) -> str:
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert "Traceback" not in result.output
    return lines[0]


def test_a_protocol_without_a_replay_is_refused_in_one_line(tmp_path) -> None:
    result = CliRunner().invoke(main, ["bench", "run", "-n", "10", "--protocol", "kafka",
                                       "--work-dir", str(tmp_path / "w")])
    assert result.exit_code == 2
    assert _error_line(result) == ("error: --protocol kafka: this build has no kafka replay "
                                   "(replays: rocketmq)")
    assert not (tmp_path / "w").exists()  # refused before anything was written


def test_resume_of_a_dir_that_is_no_run_names_it(tmp_path) -> None:
    result = CliRunner().invoke(main, ["bench", "run", "--resume", str(tmp_path)])
    assert result.exit_code == 2
    assert _error_line(result) == f"error: --resume {tmp_path}: not a bench run work dir (no run.json)"


def test_local_masters_get_a_slot_per_replay_and_delivery_task() -> None:
    cores = os.cpu_count() or 1
    assert local_master("local[*]", cores + 2) == f"local[{cores + 2}]"
    assert local_master("local[*]", 1) == f"local[{cores}]"
    assert local_master("local[2]", 6) == "local[6]"
    assert local_master("local[8]", 6) == "local[8]"
    assert local_master("local", 3) == "local[3]"
    assert local_master("spark://h:7077", 99) == "spark://h:7077"


def test_too_few_slots_for_replay_and_delivery_tasks_names_both(spark) -> None:
    slots = spark.sparkContext.defaultParallelism
    check_slots(spark, slots - 2, 2)
    with pytest.raises(SpecError, match=rf"Spark has {slots} task slots \(defaultParallelism\) "
                                        rf"but the replay needs {slots - 1} replay tasks \+ 2 "
                                        rf"delivery tasks = {slots + 1}"):
        check_slots(spark, slots - 1, 2)
