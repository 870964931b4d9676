"""The namespace fault harness itself: a cut is silent (a connect times out, nothing is
refused), healing restores the path, a one-way cut drops only its direction's packets, and
every namespace is gone afterwards, also when the body raised."""

from __future__ import annotations

import pytest

from txbroker.bench.chaos.netns import (
    PREFIX,
    Network,
    list_namespaces,
    unavailable_reason,
)

REASON = unavailable_reason()
# Namespaces, addresses and the bridge are fixed names: one run at a time (pytest -n: one worker).
pytestmark = [pytest.mark.skipif(REASON is not None, reason=REASON or ""),
              pytest.mark.xdist_group("netns")]


def ours() -> list[str]:
    return [n for n in list_namespaces() if n.startswith(PREFIX)]


@pytest.mark.timeout(60)
def test_cut_is_silent_heal_restores_and_nothing_is_left():
    before = set(ours())
    with Network(["a", "b", "c"]) as net:
        assert len(set(ours()) - before) == 4  # three nodes and the bridge
        assert net.probe("a", "b") == "refused"  # reachable: nothing listens on the probe port
        net.partition(["a"], ["b"])
        assert net.probe("a", "b") == "timeout" and net.prove_cut("a", "b")
        assert net.probe("b", "a") == "timeout"
        assert net.probe("a", "c") == "refused" and net.probe("c", "b") == "refused"  # only a<->b
        net.heal_all()
        assert net.probe("a", "b") == "refused" and net.probe("b", "a") == "refused"
        net.cut("c", "a")  # one way: c's packets to a vanish (a TCP connect needs both ways)
        assert net.probe("c", "a") == "timeout"
        net.heal("c", "a")
        assert net.probe("c", "a") == "refused"
    assert set(ours()) <= before


@pytest.mark.timeout(60)
def test_namespaces_are_removed_when_the_body_raises():
    before = set(ours())
    with pytest.raises(RuntimeError, match="boom"), Network(["x", "y"]) as net:
        net.cut("x", "y")
        raise RuntimeError("boom")
    assert set(ours()) <= before


@pytest.mark.timeout(60)
def test_leftovers_of_a_dead_run_are_swept_at_the_next_start():
    import os
    import subprocess

    dead = 4_000_000  # above any pid this machine hands out now
    while True:
        try:
            os.kill(dead, 0)
        except ProcessLookupError:
            break
        dead += 1
    name = f"{PREFIX}{dead}-left"
    subprocess.run(["ip", "netns", "add", name], check=True, timeout=10)
    try:
        with Network(["a"]):
            assert name not in list_namespaces()
    finally:
        subprocess.run(["ip", "netns", "del", name], check=False, capture_output=True, timeout=10)
