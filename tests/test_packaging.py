"""Packaging: the repository's top-level ``cli/`` and ``bench/`` install inside the txbroker
namespace, so an installed txbroker puts nothing named ``cli`` or ``bench`` in site-packages."""

from __future__ import annotations

import configparser
import importlib.metadata
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _setup_cfg() -> configparser.ConfigParser:
    cfg = configparser.ConfigParser()
    cfg.read(REPO / "setup.cfg")
    return cfg


def _listed(option: str) -> list[str]:
    return [line.strip() for line in _setup_cfg()["options"][option].splitlines() if line.strip()]


def test_every_package_directory_is_listed_under_the_txbroker_namespace():
    mapping = dict(line.split(" = ") for line in _listed("package_dir"))
    assert mapping == {"txbroker.cli": "cli", "txbroker.bench": "bench"}
    found = set()
    for name, root in {"txbroker": "txbroker", **mapping}.items():
        for init in (REPO / root).rglob("__init__.py"):
            rel = init.parent.relative_to(REPO / root).parts
            found.add(".".join((name, *rel)))
    assert sorted(_listed("packages")) == sorted(found)


def test_installed_distribution_has_one_top_level_name():
    dist = importlib.metadata.distribution("txbroker")
    assert (dist.read_text("top_level.txt") or "").split() == ["txbroker"]
    scripts = {ep.name: ep.value for ep in dist.entry_points if ep.group == "console_scripts"}
    assert scripts == {"txbroker": "txbroker.cli.main:main"}
