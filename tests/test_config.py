"""BrokerConfig: defaults mirror RocketMQ, precedence is options > environment > TOML."""

import pytest

from txbroker.config import BrokerConfig, ConfigError, config_to_toml, load_config


def test_defaults_mirror_rocketmq():
    c = BrokerConfig()
    assert (c.transaction_check_interval, c.transaction_timeout, c.transaction_check_max) == (60.0, 6.0, 15)
    assert c.file_reserved_time == 72 * 3600
    assert (c.broker_port, c.namesrv_port, c.listen_host) == (10911, 9876, "127.0.0.1")
    assert c.max_frame_size == 16 * 1024 * 1024 and c.max_message_size == 4 * 1024 * 1024


def test_precedence_options_over_env_over_toml(tmp_path):
    toml = tmp_path / "b.toml"
    toml.write_text('[broker]\nbroker_port = 1111\nflush_mode = "sync"\ntransaction_check_max = 3\n')
    env = {"TXBROKER_BROKER_PORT": "2222", "TXBROKER_TRANSACTION_CHECK_MAX": "4", "OTHER": "x"}
    c = load_config({"broker_port": 3333, "flush_mode": None}, env, toml)
    assert c.broker_port == 3333
    assert c.transaction_check_max == 4
    assert c.flush_mode == "sync"


@pytest.mark.parametrize(
    "options, fragment",
    [
        ({"flush_mode": "sometimes"}, "flush_mode"),
        ({"broker_port": 70000}, "broker_port"),
        ({"broker_port": "abc"}, "broker_port"),
        ({"disk_max_used_ratio": 1.5}, "disk_max_used_ratio"),
        ({"auto_create_topic": "maybe"}, "auto_create_topic"),
        ({"no_such_setting": 1}, "no_such_setting"),
        ({"advertised_host": "not a host!"}, "advertised_host"),
        ({"advertised_host": "0.0.0.0"}, "advertised_host"),
        ({"advertised_host": "::1"}, "advertised_host"),
    ],
)
def test_invalid_values_are_rejected_with_the_field_name(options, fragment):
    with pytest.raises(ConfigError, match=fragment):
        load_config(options, environ={})


def test_advertised_host_takes_names_and_ipv4():
    for host in ("", "10.0.0.5", "broker-a.example.com", "localhost"):
        assert load_config({"advertised_host": host}, environ={}).advertised_host == host


def test_unknown_toml_key_is_an_error(tmp_path):
    toml = tmp_path / "b.toml"
    toml.write_text("brokr_port = 1\n")
    with pytest.raises(ConfigError, match="brokr_port"):
        load_config(None, {}, toml)


def test_printed_config_reads_back_unchanged(tmp_path):
    for c in (BrokerConfig(), BrokerConfig(data_dir='/tmp/a "quoted" dir\\x', acl_file="acl.yml",
                                           auto_create_topic=False, flush_interval=0.25)):
        path = tmp_path / "printed.toml"
        path.write_text(config_to_toml(c))
        assert load_config(None, {}, path) == c


@pytest.mark.parametrize("raw, expected", [("67108864", 64 << 20), ("64MiB", 64 << 20),
                                           ("64 MiB", 64 << 20), ("64m", 64 << 20),
                                           ("1GiB", 1 << 30), ("8192KiB", 8 << 20)])
def test_sizes_take_a_binary_unit(raw, expected) -> None:
    assert load_config({"segment_size": raw}).segment_size == expected
    assert load_config(environ={"TXBROKER_SEGMENT_SIZE": raw}).segment_size == expected
    assert load_config({"max_message_size": "1k"}).max_message_size == 1024


@pytest.mark.parametrize("raw", ["64MB", "64 MiBs", "-1MiB", "1.5GiB", "MiB"])
def test_a_size_with_an_unknown_unit_names_the_setting_and_the_units(raw) -> None:
    with pytest.raises(ConfigError, match=r"segment_size=.*must be a size in bytes, e\.g\. "
                                          r"67108864 or 64MiB \(units KiB, MiB, GiB\)"):
        load_config({"segment_size": raw})


def test_a_unit_is_only_for_sizes() -> None:
    with pytest.raises(ConfigError, match="must be an integer"):
        load_config({"transaction_history_size": "1KiB"})


CONTROLLED = {"controller_addr": "127.0.0.1:9878"}


@pytest.mark.parametrize("options, named", [
    ({"controller_heartbeat_interval": 1.5}, ("controller_heartbeat_interval=1.5",
                                              "controller_lease=3")),
    ({**CONTROLLED, "ha_idle_timeout": 5.0}, ("ha_idle_timeout=5", "controller_lease=3")),
    ({"ha_heartbeat_interval": 10.0}, ("ha_heartbeat_interval=10", "ha_idle_timeout=20 (derived)")),
    ({**CONTROLLED, "slave_timeout": 3.0}, ("slave_timeout=3", "controller_lease=3")),
    ({**CONTROLLED, "controller_lease": 2.0, "slave_timeout": 2.5},
     ("slave_timeout=2.5", "controller_lease=2")),
])
def test_cluster_time_limits_are_checked_against_each_other(options, named) -> None:
    with pytest.raises(ConfigError) as err:
        load_config({k: str(v) for k, v in options.items()}, {})
    line = str(err.value)
    assert "\n" not in line
    for setting in named:
        assert setting in line, line


def test_cluster_time_limits_derive_from_the_lease_in_controller_mode() -> None:
    classic = BrokerConfig().timing()
    assert (classic.ha_heartbeat, classic.ha_idle_timeout, classic.slave_timeout) == (5.0, 20.0, 3.0)
    t = BrokerConfig(controller_addr="127.0.0.1:9878", controller_lease=2.0,
                     controller_heartbeat_interval=0.5).timing()
    assert t.ha_idle_timeout <= t.lease and t.ha_heartbeat < t.ha_idle_timeout / 2
    assert t.slave_timeout < t.lease
    # The lease a master counts on is strictly shorter than the controller's promotion delay.
    assert 0 < t.assumed_lease < t.lease - 0.05
    # A slave time-out that is fine without a controller is checked once one decides.
    assert BrokerConfig(slave_timeout=5.0).timing().slave_timeout == 5.0
    with pytest.raises(ConfigError, match="slave_timeout=5 and controller_lease=3"):
        BrokerConfig(slave_timeout=5.0, controller_addr="127.0.0.1:9878")


def test_serve_refuses_clashing_time_limits_in_one_line(tmp_path) -> None:
    from click.testing import CliRunner

    from txbroker.cli.main import main

    result = CliRunner().invoke(main, ["serve", "--data-dir", str(tmp_path / "d"),
                                       "--controller-addr", "127.0.0.1:9878",
                                       "--namesrv-addr", "127.0.0.1:9876",
                                       "--controller-lease", "2", "--ha-idle-timeout", "4"],
                                env={"TXBROKER_SLAVE_TIMEOUT": "1"})
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.output, result.output
    assert "ha_idle_timeout=4" in lines[0] and "controller_lease=2" in lines[0]
    assert not (tmp_path / "d").exists()
