"""What lets the bench leave one machine: a work dir as a URI read and written through Hadoop's
FileSystem, the package zip executors import txbroker from, the driver's address, and an
embedded broker that starts from anywhere and says why when it does not."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import zipfile
from dataclasses import asdict

import pytest
from click.testing import CliRunner

from txbroker.bench.chaos.process import free_port
from txbroker.bench.trace.embedded import EmbeddedBroker, EmbeddedBrokerError
from txbroker.bench.trace.fs import WorkFS, join, local_path
from txbroker.bench.trace.generate import default_meta
from txbroker.bench.trace.ship import ROOTS, build_zip
from txbroker.bench.trace.spark import check_master, is_local, route_address
from txbroker.bench.trace.spec import BrokerSettings, TraceMeta
from txbroker.cli.main import main


def test_local_path_of_uris():
    assert local_path("file:/tmp/a/b") == local_path("file:///tmp/a/b") == \
        local_path("file://localhost/tmp/a/b")
    assert str(local_path("file:/tmp/a/b")) == "/tmp/a/b"
    assert local_path("hdfs://nn:8020/x") is None
    assert local_path("s3a://bucket/x") is None
    assert local_path("file://otherhost/x") is None
    assert join("hdfs://nn/x/", "trace", "_m.json") == "hdfs://nn/x/trace/_m.json"


def test_work_fs_qualifies_reads_writes_and_refuses_foreign_dirs(spark, tmp_path, monkeypatch):
    fs = WorkFS(spark)
    # A relative path is qualified against the driver's directory, once, on the driver: the
    # URI executors get is absolute.
    monkeypatch.chdir(tmp_path)
    rel = fs.qualify("relative/dir")
    assert local_path(rel) == tmp_path / "relative" / "dir" and rel.startswith("file:")
    assert fs.qualify(tmp_path.as_uri()) == fs.qualify(str(tmp_path))

    d = fs.qualify(tmp_path / "w")
    assert not fs.exists(d)
    fs.write_text(join(d, "a.json"), '{"x": 1}\n')         # parents are created
    fs.write_bytes(join(d, "b.bin"), bytes(range(256)) * 40)
    assert fs.read_text(join(d, "a.json")) == '{"x": 1}\n'
    assert fs.read_bytes(join(d, "b.bin")) == bytes(range(256)) * 40
    assert fs.names(d) == ["a.json", "b.bin"]                # Hadoop's .crc files left out
    with pytest.raises(FileNotFoundError) as err:
        fs.read_text(join(d, "missing.json"))
    assert err.value.filename == join(d, "missing.json")

    # Only an old one of ours (or an empty dir) is replaced.
    with pytest.raises(FileExistsError, match="not a trace"):
        fs.replace_dir(d, "_marker", "trace")
    assert fs.exists(join(d, "a.json"))
    fs.write_text(join(d, "_marker"), "")
    fs.replace_dir(d, "_marker", "trace")
    assert not fs.exists(d) and not (tmp_path / "w").exists()
    (tmp_path / "w").mkdir()
    fs.replace_dir(d, "_marker", "trace")                    # empty: fine
    assert not fs.exists(d)

    # A published file appears whole: nothing is left beside it, and it is never replaced.
    fs.publish_text(join(d, "done.json"), '{"seconds": 1}\n')
    assert fs.read_text(join(d, "done.json")) == '{"seconds": 1}\n'
    assert fs.names(d) == ["done.json"]
    with pytest.raises(OSError, match="could not rename"):
        fs.publish_text(join(d, "done.json"), "{}\n")
    assert fs.read_text(join(d, "done.json")) == '{"seconds": 1}\n'
    assert fs.names(d) == ["done.json"]


def test_work_fs_names_a_scheme_it_cannot_read(spark):
    with pytest.raises(OSError) as err:
        WorkFS(spark).exists("nosuchfs://bucket/bench")
    assert err.value.filename == "nosuchfs://bucket/bench"
    assert "nosuchfs" in err.value.strerror


def test_trace_metadata_round_trips_through_a_uri(spark, tmp_path):
    fs = WorkFS(spark)
    meta = default_meta(10, broker=BrokerSettings(transaction_check_max=5))
    uri = (tmp_path / "t").as_uri()
    meta.write(fs, uri)
    assert TraceMeta.read(fs, uri) == meta
    # run.json holds the same dict: --resume rebuilds every nested setting from it.
    assert TraceMeta.from_dict(json.loads(json.dumps(asdict(meta)))) == meta


def test_shipped_zip_alone_provides_the_package(tmp_path):
    """Executors import txbroker from the zip only: every module a task or the CLI needs comes
    out of it, not from the installed package (which a worker does not have)."""
    path = build_zip(tmp_path)
    assert path.name.startswith("txbroker-") and path.suffix == ".zip"
    names = set(zipfile.ZipFile(path).namelist())
    for needed in ("txbroker/__init__.py", "txbroker/cli/main.py", "txbroker/bench/trace/replay.py",
                   "txbroker/client/__init__.py", "txbroker/remoting/codec.py"):
        assert needed in names, needed
    assert not any("__pycache__" in n or n.endswith(".pyc") for n in names)
    assert ROOTS[0] == "txbroker"
    probe = ("import sys; sys.path.insert(0, sys.argv[1]); "
             "import txbroker.bench.trace.replay as r, txbroker.client as c, txbroker.cli.main as m; "
             "print(r.__file__); print(c.__file__); print(m.__file__)")
    out = subprocess.run([sys.executable, "-P", "-c", probe, str(path)], check=False, cwd=tmp_path,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    files = out.stdout.split()
    assert len(files) == 3 and all(f.startswith(str(path) + "/txbroker/") for f in files), files
    # Same content, same name: a worker never confuses two versions of the code.
    assert build_zip(tmp_path / ".." / tmp_path.name).name == path.name


def test_driver_address_is_the_route_to_the_master_never_localhost():
    assert is_local("local[*]") and is_local("local") and is_local("local[2]")
    assert not is_local("spark://127.0.0.1:7077")
    assert route_address("spark://127.0.0.1:7077") == "127.0.0.1"
    assert route_address("spark://localhost:7077,127.0.0.1:7078") == "127.0.0.1"


def test_embedded_broker_starts_whatever_the_current_directory_holds(tmp_path, monkeypatch):
    """A ``txbroker``, ``cli`` or ``bench`` folder in the current directory does not stand in
    for the installed package (the broker runs ``python -P -m txbroker``)."""
    for name in ("txbroker", "cli", "bench"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "__init__.py").write_text("raise SystemExit('shadowed')\n")
    monkeypatch.chdir(tmp_path)
    with EmbeddedBroker(BrokerSettings()) as broker:
        assert broker.namesrv_addr.startswith("127.0.0.1:")
        assert "-P" in broker.argv() and "-m" in broker.argv()
    assert not broker.root.exists()


def test_embedded_broker_that_fails_says_why_with_its_log(tmp_path):
    (tmp_path / "data").write_text("a file where the data dir should be")
    with pytest.raises(EmbeddedBrokerError) as err, EmbeddedBroker(BrokerSettings(), data_dir=str(tmp_path)):
        pass
    lines = str(err.value).splitlines()
    assert lines[0].startswith("embedded broker (127.0.0.1) did not start: error:"), lines
    assert str(tmp_path / "data") in lines[0]
    assert lines[1] == "broker log, last lines:" and len(lines) >= 3


def test_embedded_broker_failure_is_an_error_line_and_the_log_through_the_cli(tmp_path):
    result = CliRunner().invoke(main, ["bench", "run", "-n", "10", "--work-dir", str(tmp_path),
                                       "--broker-host", "127.0.0.1",
                                       "--advertise", "not a host name!", "--master", "local[1]"])
    assert result.exit_code == 1, result.output
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and errors[0].startswith("error: bench run: embedded broker (127.0.0.1 advertised as "
                            "not a host name!) did not start: error: advertised_host="), result.stderr
    assert "broker log, last lines:" in result.stderr


def test_cluster_runs_need_a_shared_work_dir_and_no_broker_options_with_namesrv():
    runner = CliRunner()
    r = runner.invoke(main, ["bench", "run", "-n", "10", "--master", "spark://spark-master.invalid:7077"])
    assert r.exit_code == 2
    assert r.stderr.startswith("error: --work-dir is required with a cluster master"), r.stderr
    r = runner.invoke(main, ["bench", "run", "-n", "10", "--namesrv", "127.0.0.1:9876",
                             "--broker-host", "0.0.0.0"])
    assert r.exit_code == 2
    assert "with --namesrv / --bootstrap there is none" in r.stderr


def test_a_master_nobody_answers_at_is_one_error_line_at_once(tmp_path):
    """Spark itself would retry for a minute, then stop with a stack trace."""
    port = free_port()
    with pytest.raises(OSError) as err:
        check_master(f"spark://127.0.0.1:{port}", timeout=2)
    assert err.value.filename == f"spark://127.0.0.1:{port}"
    assert f"127.0.0.1:{port}" in err.value.strerror
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        live = server.getsockname()[1]
        check_master(f"spark://127.0.0.1:{port},127.0.0.1:{live}")  # one of several answers
    # A command of its own (in this process a SparkSession may already run, and is reused).
    result = subprocess.run([sys.executable, "-P", "-m", "txbroker", "bench", "run", "-n", "10",
                             "--work-dir", str(tmp_path), "--master", f"spark://127.0.0.1:{port}"],
                            capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 1, result.stderr
    assert result.stderr.splitlines()[-1] == (f"error: bench run: no Spark master answers "
                                              f"(127.0.0.1:{port}: Connection refused): "
                                              f"spark://127.0.0.1:{port}")
