"""Mistakes refused at start-up with one line that names them: two listeners of one broker on
one port, a ``TXBROKER_*`` variable nothing reads, an address whose port is out of range."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from txbroker.cli.main import main
from txbroker.client.namesrv import parse_addresses
from txbroker.config import BrokerConfig, ConfigError, check_environ, load_config

REPO_ROOT = Path(__file__).resolve().parents[1]
CLUSTER = {"namesrv_addr": "127.0.0.1:9876"}


def _txbroker(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("TXBROKER_")}
    return subprocess.run([sys.executable, "-P", "-m", "txbroker", *args], cwd=REPO_ROOT,
                          capture_output=True, text=True, timeout=60, check=False,
                          env={**clean, **(env or {})})


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# --- ports ------------------------------------------------------------------------------------
@pytest.mark.parametrize("settings, message", [
    ({"broker_port": 9876}, "broker_port and namesrv_port are both 9876"),
    ({"kafka_port": 10911}, "broker_port and kafka_port are both 10911"),
    ({"metrics_port": 9876}, "namesrv_port and metrics_port are both 9876"),
    ({**CLUSTER, "kafka_port": 10912}, "ha_port (-1: broker_port + 1) and kafka_port are both 10912"),
    ({**CLUSTER, "ha_port": 10911}, "broker_port and ha_port are both 10911"),
    ({**CLUSTER, "broker_port": 65535}, "ha_port=-1 means broker_port + 1, but broker_port is 65535"),
])
def test_listeners_of_one_broker_on_one_port_are_refused(settings, message) -> None:
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")
                       .replace("+", r"\+")):
        BrokerConfig(**settings)


@pytest.mark.parametrize("settings", [
    {"broker_port": 0, "namesrv_port": 0, "kafka_port": 0, "metrics_port": 0},  # all ephemeral
    {"namesrv_port": -1, "kafka_port": -1},
    {**CLUSTER, "namesrv_port": 10912, "ha_port": 10999},  # no embedded name server in a cluster
    {"kafka_port": 10912},  # no HA listener without name servers
    {"listen_host": "10.0.0.5", "metrics_port": 10911},  # metrics listen on 127.0.0.1 only
])
def test_ports_that_do_not_clash_are_accepted(settings) -> None:
    BrokerConfig(**settings)


def test_serve_says_which_ports_clash_before_binding(tmp_path: Path) -> None:
    port = str(_free_port())
    res = _txbroker("serve", "--broker-port", port, "--namesrv-port", port,
                    "--data-dir", str(tmp_path / "data"))
    assert res.returncode == 2, res
    assert res.stderr == (f"error: broker_port and namesrv_port are both {port}: every listener "
                          "of a broker needs its own port\n"), res.stderr
    assert not (tmp_path / "data").exists()


# --- TXBROKER_* variables ---------------------------------------------------------------------
def test_unknown_variable_names_the_closest_setting() -> None:
    with pytest.raises(ConfigError, match="^unknown variable TXBROKER_SEGMNT_SIZE: no setting or "
                       "option reads it; did you mean TXBROKER_SEGMENT_SIZE\\?$"):
        check_environ({"TXBROKER_SEGMNT_SIZE": "1", "OTHER": "x"})
    check_environ({"TXBROKER_SEGMENT_SIZE": "1", "TXBROKER_NAMESRV": "h:1"}, {"TXBROKER_NAMESRV"})


@pytest.mark.parametrize("command", [("serve", "--print-config"), ("namesrv", "--port", "0"),
                                     ("controller", "--port", "0", "--data-dir")])
def test_servers_refuse_a_misspelt_variable_at_start_up(command, tmp_path: Path) -> None:
    if command[-1] == "--data-dir":
        command = (*command, str(tmp_path / "controller"))
    res = _txbroker(*command, env={"TXBROKER_SEGMNT_SIZE": "1048576"})
    assert res.returncode == 2, res
    assert res.stderr == ("error: unknown variable TXBROKER_SEGMNT_SIZE: no setting or option "
                          "reads it; did you mean TXBROKER_SEGMENT_SIZE?\n"), res.stderr


def test_serve_accepts_the_variables_client_commands_read() -> None:
    # The README exports client variables in the shell that starts brokers.
    env = {"TXBROKER_NAMESRV": "127.0.0.1:9876", "TXBROKER_ACCESS_KEY": "k",
           "TXBROKER_SECRET_KEY": "s", "TXBROKER_NAMESRV_ADDR": "", "TXBROKER_CONTROLLER_ADDR": "",
           "TXBROKER_SEGMENT_SIZE": str(8 << 20)}
    res = _txbroker("serve", "--print-config", env=env)
    assert res.returncode == 0, res.stderr
    assert f"segment_size = {8 << 20}\n" in res.stdout


# --- addresses --------------------------------------------------------------------------------
def test_a_port_out_of_range_is_said_so() -> None:
    with pytest.raises(ValueError, match="^name-server address '127.0.0.1:99999': port 99999 is "
                       "out of range 1..65535$"):
        parse_addresses("127.0.0.1:99999")
    with pytest.raises(ValueError, match="expected host:port"):
        parse_addresses("127.0.0.1")
    with pytest.raises(ConfigError, match="^namesrv_addr: address '127.0.0.1:99999': port 99999 "
                       "is out of range 1..65535"):
        load_config({"namesrv_addr": "127.0.0.1:9876;127.0.0.1:99999"}, environ={})


def test_cli_says_the_port_is_out_of_range() -> None:
    res = CliRunner().invoke(main, ["produce", "--topic", "T", "--body", "x",
                                    "--namesrv", "127.0.0.1:99999"], env={"TXBROKER_NAMESRV": None})
    assert res.exit_code == 1, res.output
    assert res.stderr.strip().endswith("name-server address '127.0.0.1:99999': port 99999 is out "
                                       "of range 1..65535"), res.stderr
    assert "\n" not in res.stderr.strip()
    res = _txbroker("serve", "--namesrv-addr", "127.0.0.1:99999", "--print-config")
    assert res.returncode == 2
    assert "namesrv_addr: address '127.0.0.1:99999': port 99999 is out of range 1..65535" in res.stderr
