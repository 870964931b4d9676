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


@pytest.mark.parametrize(("argv", "line"), [
    (["--protocol", "kafka", "--namesrv", "127.0.0.1:9876"],
     "error: --protocol kafka against an external cluster needs --bootstrap"),
    (["--protocol", "both", "--bootstrap", "127.0.0.1:9092"],
     "error: --protocol rocketmq against an external cluster needs --namesrv"),
    (["--cluster", "2", "--namesrv", "127.0.0.1:9876"],
     "error: --cluster starts a cluster; --namesrv / --bootstrap name an external one"),
    (["--fault-plan", "plan.yaml"],
     ("error: --fault-plan needs --cluster GROUPS: faults are applied to the processes of a "
      "cluster the bench starts")),
])
def test_what_a_run_replays_against_must_fit_its_protocols(tmp_path, argv, line) -> None:
    result = CliRunner().invoke(main, ["bench", "run", "-n", "10", *argv,
                                       "--work-dir", str(tmp_path / "w")])
    assert result.exit_code == 2
    assert _error_line(result) == line
    assert not (tmp_path / "w").exists()  # refused before anything was written


def test_a_bad_fault_plan_is_refused_before_spark_starts(tmp_path) -> None:
    plan = tmp_path / "plan.yaml"
    plan.write_text("- {at: 5, action: explode, group: broker-a}\n")
    result = CliRunner().invoke(main, ["bench", "run", "-n", "10", "--cluster", "2",
                                       "--fault-plan", str(plan), "--work-dir", str(tmp_path / "w")])
    assert result.exit_code == 2
    assert result.stderr.startswith(f"error: {plan}: fault 1"), result.stderr
    assert "Traceback" not in result.output
    assert not (tmp_path / "w").exists()


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
