"""``python -m txbroker.bench.chaos [--kills 20 --seed 1 --flush sync]``: run the chaos driver, print the
report table, exit 1 when an invariant was violated.  ``--cluster``: the master of a SYNC_MASTER
broker group is killed instead (:mod:`txbroker.bench.chaos.cluster`)."""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
import time

from txbroker.bench.chaos.driver import ChaosConfig, run_chaos


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m txbroker.bench.chaos", description=__doc__)
    ap.add_argument("--kills", type=int, default=20)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--producers", type=int, default=4)
    ap.add_argument("--flush", choices=("sync", "async"), default="sync")
    ap.add_argument("--min-interval", type=float, default=0.5)
    ap.add_argument("--max-interval", type=float, default=1.5)
    ap.add_argument("--settle-timeout", type=float, default=60.0)
    ap.add_argument("--data-dir", default=None, help="keep the broker's data and log here")
    ap.add_argument("--cluster", action="store_true",
                    help="a controller, a name server and a two-broker SYNC_MASTER group; "
                         "the master is SIGKILLed each time")
    ap.add_argument("--lease", type=float, default=2.0, help="--cluster: the controller's lease")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.ERROR)
    if args.cluster:
        return _cluster(args)
    cfg = ChaosConfig(seed=args.seed, kills=args.kills, producers=args.producers,
                      flush_mode=args.flush, min_kill_interval=args.min_interval,
                      max_kill_interval=args.max_interval, settle_timeout=args.settle_timeout,
                      data_dir=args.data_dir)
    t0 = time.monotonic()
    report = asyncio.run(run_chaos(cfg))
    print(f"chaos run: seed={cfg.seed} flush={cfg.flush_mode} kills={cfg.kills} "
          f"producers={cfg.producers} wall={time.monotonic() - t0:.1f}s")
    print(report.table())
    for name in ("lost", "duplicated", "wrongly_delivered", "unknown_delivered",
                 "unexpected_check_keys", "offsets_moved_back"):
        items = getattr(report, name)
        if items:
            print(f"{name}: {items[:10]}")
    return 0 if report.ok else 1


def _cluster(args: argparse.Namespace) -> int:
    from txbroker.bench.chaos.cluster import ClusterChaosConfig, run_cluster_chaos

    cfg = ClusterChaosConfig(seed=args.seed, kills=args.kills, producers=args.producers,
                             lease=args.lease, settle_timeout=args.settle_timeout,
                             min_kill_interval=args.min_interval, max_kill_interval=args.max_interval,
                             data_dir=args.data_dir)
    t0 = time.monotonic()
    report = asyncio.run(run_cluster_chaos(cfg))
    print(f"cluster chaos run: seed={cfg.seed} kills={cfg.kills} producers={cfg.producers} "
          f"lease={cfg.lease}s wall={time.monotonic() - t0:.1f}s")
    print(report.table())
    for name in ("lost", "duplicated", "wrongly_delivered", "unknown_delivered"):
        items = getattr(report.ledger, name)
        if items:
            print(f"{name}: {items[:10]}")
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
