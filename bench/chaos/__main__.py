"""``python -m txbroker.bench.chaos [--kills 20 --seed 1 --flush sync]``: run the chaos driver, print the
report table, exit 1 when an invariant was violated.  ``--cluster``: the master of a SYNC_MASTER
broker group is killed instead (:mod:`txbroker.bench.chaos.cluster`).  ``--partitions``: partitions,
pauses and lost replies on a SYNC_MASTER and an ASYNC_MASTER group in network namespaces
(:mod:`txbroker.bench.chaos.partitions`; needs root); with ``--kafka`` the same scenarios driven by
Kafka clients (:mod:`txbroker.bench.chaos.kafka_partitions`)."""

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
    ap.add_argument("--lease", type=float, default=2.0,
                    help="--cluster/--partitions: the controller's lease (--etcd: the etcd lease, "
                         "whole seconds)")
    ap.add_argument("--etcd", action="store_true",
                    help="--cluster: elect on a three-member etcd instead of a controller, its "
                         "leader SIGKILLed before each master kill; --partitions: the cluster "
                         "elects on a three-member etcd, each member in a namespace of its own, "
                         "and the etcd scenarios h..l run too")
    ap.add_argument("--partitions", action="store_true",
                    help="partition, pause and lost-reply scenarios on a controller-mode cluster in "
                         "network namespaces, judged by the history checker (needs root)")
    ap.add_argument("--scenario", default=None,
                    help="--partitions: comma-separated scenarios a..m (default: a..g and m; "
                         "with --etcd all of a..m; h..l need --etcd)")
    ap.add_argument("--netns-prefix", default=None,
                    help="--partitions: the namespaces' name prefix (default txbc, with --etcd txbe)")
    ap.add_argument("--subnet", default=None,
                    help="--partitions: the private subnet's first three parts (default 10.213.0, "
                         "with --etcd 10.214.0)")
    ap.add_argument("--runs", type=int, default=5, help="--partitions: runs per scenario")
    ap.add_argument("--kafka", action="store_true",
                    help="--partitions: every broker's Kafka listener open, the load from Kafka clients "
                         "(idempotent, transactional over both groups, an exactly-once pipeline)")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.ERROR)
    if args.cluster:
        return _cluster(args)
    if args.partitions:
        return _partitions(args)
    if args.kafka:
        print("--kafka: only with --partitions (the Kafka clients drive the partition scenarios)",
              file=sys.stderr)
        return 2
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
                             data_dir=args.data_dir, etcd=args.etcd)
    t0 = time.monotonic()
    report = asyncio.run(run_cluster_chaos(cfg))
    print(f"cluster chaos run: seed={cfg.seed} kills={cfg.kills} producers={cfg.producers} "
          f"lease={cfg.lease}s election={'etcd' if cfg.etcd else 'controller'} "
          f"wall={time.monotonic() - t0:.1f}s")
    print(report.table())
    for name in ("lost", "duplicated", "wrongly_delivered", "unknown_delivered"):
        items = getattr(report.ledger, name)
        if items:
            print(f"{name}: {items[:10]}")
    return 0 if report.ok else 1


def _partitions(args: argparse.Namespace) -> int:
    from txbroker.bench.chaos.netns import NetnsUnavailable, unavailable_reason
    from txbroker.bench.chaos.partitions import (
        ETCD_ONLY,
        SCENARIOS,
        PartitionsConfig,
        report,
        run_partitions,
    )

    if args.scenario is None:
        scenarios = tuple(s for s in SCENARIOS if args.etcd or s not in ETCD_ONLY)
    else:
        scenarios = tuple(s.strip() for s in args.scenario.split(",") if s.strip())
    try:
        cfg = PartitionsConfig(scenarios=scenarios,
                               runs=args.runs, seed=args.seed, lease=args.lease,
                               producers=args.producers, settle_timeout=args.settle_timeout,
                               work_dir=args.data_dir, kafka=args.kafka, etcd=args.etcd,
                               netns_prefix=args.netns_prefix, subnet=args.subnet,
                               # Kafka runs wait for the clients to resume and the pipelines to drain
                               run_timeout=300.0 if args.kafka else PartitionsConfig.run_timeout)
    except ValueError as exc:
        print(f"--partitions: {exc}", file=sys.stderr)
        return 2
    reason = unavailable_reason()
    if reason:
        print(f"--partitions skipped: {reason}", file=sys.stderr)
        return 2
    t0 = time.monotonic()
    try:
        results = run_partitions(cfg, progress=lambda line: print(line, flush=True))
    except NetnsUnavailable as exc:
        print(f"--partitions skipped: {exc}", file=sys.stderr)
        return 2
    print(f"partitions run{' (Kafka clients)' if cfg.kafka else ''}"
          f"{' on etcd' if cfg.etcd else ''}: seed={cfg.seed} runs={cfg.runs} "
          f"scenarios={','.join(cfg.scenarios)} lease={cfg.lease}s wall={time.monotonic() - t0:.1f}s")
    if cfg.kafka:
        from txbroker.bench.chaos.kafka_partitions import report as kafka_report

        print(kafka_report(results))
    else:
        print(report(results))
    return 0 if all(r.ok for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
