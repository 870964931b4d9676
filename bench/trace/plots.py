"""The report's plots, drawn from a run's raw event times (not from per-second counts), so a
short run gets sub-second buckets and a long one coarser ones.

Every time axis counts seconds from the run's first send and is cut into buckets of
:func:`bucket_seconds`; counts are drawn as steps (a bucket is an interval, a line between
bucket values would invent the values in between).  matplotlib's ``Figure`` is used without
pyplot: no display, no global state.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import numpy as np

#: Bucket widths a time axis may use (s): 1-2-5 steps below ten seconds, then round
#: multiples of a minute and an hour.  No step is more than 2.5 times the one before, which
#: is what keeps the bucket count within [MIN_BUCKETS, MAX_BUCKETS].
BUCKET_STEPS = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0,
                15.0, 30.0, 60.0, 120.0, 300.0, 600.0, 900.0, 1800.0, 3600.0)
MIN_BUCKETS, TARGET_BUCKETS, MAX_BUCKETS = 20, 50, 100
_DPI = 100


def bucket_count(span_s: float, step: float) -> int:
    """Buckets of ``step`` seconds covering ``[0, span_s]`` (the last event included)."""
    return math.floor(span_s / step + 1e-9) + 1


def bucket_seconds(span_s: float) -> float:
    """Bucket width for a time axis of ``span_s`` seconds: the narrowest step that gives at
    most :data:`TARGET_BUCKETS` buckets.  The result always gives between :data:`MIN_BUCKETS`
    and :data:`MAX_BUCKETS` buckets, except for runs shorter than ``MIN_BUCKETS`` times the
    smallest step (20 ms), which get fewer."""
    if not span_s >= 0 or math.isinf(span_s):
        raise ValueError(f"span must be a finite number of seconds >= 0, not {span_s!r}")
    for step in BUCKET_STEPS:
        if bucket_count(span_s, step) <= TARGET_BUCKETS:
            return step
    hour = BUCKET_STEPS[-1]
    return hour * math.ceil(span_s / hour / (TARGET_BUCKETS - 1))


def fmt_seconds(s: float) -> str:
    """``0.1 s``, ``5 s``, ``2 min``, ``1 h`` — a bucket width as a reader says it."""
    if s >= 3600 and s % 3600 == 0:
        return f"{s / 3600:g} h"
    if s >= 60 and s % 60 == 0:
        return f"{s / 60:g} min"
    return f"{s:g} s"


@dataclass
class Events:
    """A run's event times in seconds since its first send (NaN where an event never came)."""

    start: np.ndarray      # per transaction: send_message_in_transaction called
    half: np.ndarray       # half stored
    decided: np.ndarray    # COMMIT/ROLLBACK sent
    first_recv: np.ndarray  # first delivery of the transaction's message
    recv: np.ndarray       # every delivery
    check: np.ndarray      # every check-back's arrival
    check_phase: np.ndarray  # the producer's state then: running | undecided | decided

    @property
    def span(self) -> float:
        """Seconds from the first send to the last event of any kind."""
        ends = [np.nanmax(a) for a in (self.start, self.decided, self.recv, self.check)
                if a.size and not np.all(np.isnan(a))]
        return max([0.0, *ends])

    @property
    def send_span(self) -> float:
        """Seconds from the first send to the last send."""
        return float(np.nanmax(self.start)) if not np.all(np.isnan(self.start)) else 0.0

    def latencies_ms(self) -> dict[str, np.ndarray]:
        """Per transaction, ms from the send call to: the half stored, the decision sent, the
        first delivery (NaN where it never happened)."""
        return {"send": (self.half - self.start) * 1000.0,
                "decision": (self.decided - self.start) * 1000.0,
                "end to end": (self.first_recv - self.start) * 1000.0}


def _edges(span_s: float, step: float) -> np.ndarray:
    return np.arange(bucket_count(span_s, step) + 1) * step


def _per_second(times: np.ndarray, edges: np.ndarray) -> np.ndarray:
    counts, _ = np.histogram(times[~np.isnan(times)], bins=edges)
    return counts / (edges[1] - edges[0])


def _save(fig, path: Path | BinaryIO) -> Path | BinaryIO:
    fig.tight_layout()
    fig.savefig(path, dpi=_DPI, format="png")
    return path


def throughput(ev: Events, title: str, path: Path | BinaryIO):
    from matplotlib.figure import Figure

    step = bucket_seconds(ev.span)
    edges = _edges(ev.span, step)
    fig = Figure(figsize=(9, 4.5))
    ax = fig.add_subplot()
    for name, times in (("started", ev.start), ("decided (commit / rollback sent)", ev.decided),
                        ("delivered", ev.recv)):
        ax.stairs(_per_second(times, edges), edges, label=name, linewidth=1.5)
    ax.set_xlim(0, edges[-1])
    ax.set_ylim(bottom=0)
    ax.set_xlabel("time since the first send (s)")
    ax.set_ylabel(f"transactions / s  ({fmt_seconds(step)} buckets)")
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(loc="upper right", fontsize=9)
    return _save(fig, path)


#: Fractions labelled on the latency distribution's logit axis.
_FRACTION_TICKS = (0.0001, 0.001, 0.01, 0.1, 0.5, 0.9, 0.99, 0.999, 0.9999)


def latency_cdf(ev: Events, title: str, path: Path | BinaryIO):
    """Cumulative distribution on a log time axis and a logit fraction axis: the logit scale
    gives p50, p90, p99 and p99.9 equal room, so the tail is as legible as the median."""
    from matplotlib.figure import Figure
    from matplotlib.ticker import FuncFormatter, NullFormatter

    fig = Figure(figsize=(9, 4.5))
    ax = fig.add_subplot()
    drawn = 0
    most = 1
    for name, ms in ev.latencies_ms().items():
        ms = np.sort(ms[~np.isnan(ms)])
        if not ms.size:
            continue
        # A clock step can make a latency 0 or negative; the log axis shows it at 1 µs.
        ms = np.maximum(ms, 1e-3)
        n = ms.size
        most = max(most, n)
        p50, p99 = np.percentile(ms, [50, 99])
        ax.step(ms, (np.arange(1, n + 1) - 0.5) / n, where="post",
                label=f"{name}: n={n:,}, p50 {p50:,.1f} ms, p99 {p99:,.1f} ms")
        drawn += 1
    if drawn:
        ax.set_xscale("log")
        ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _: f"{x:,g}"))
        ax.set_yscale("logit")
        edge = 0.5 / most
        ticks = [q for q in _FRACTION_TICKS if edge <= q <= 1 - edge]
        ax.set_ylim(edge * 0.8, 1 - edge * 0.8)
        ax.set_yticks(ticks, [f"{q * 100:g}%" for q in ticks])
        ax.yaxis.set_minor_formatter(NullFormatter())
        ax.legend(loc="lower right", fontsize=9)
    else:
        ax.text(0.5, 0.5, "no latencies recorded", ha="center", transform=ax.transAxes)
    ax.set_xlabel("ms since send_message_in_transaction was called (log scale)")
    ax.set_ylabel("fraction of transactions ≤ x (logit scale)")
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3, which="both")
    return _save(fig, path)


def latency_over_time(ev: Events, title: str, path: Path | BinaryIO):
    """p50 and p99 of each latency per bucket of send time: a slowdown shows where it
    happened, which one distribution over the whole run hides."""
    from matplotlib.figure import Figure
    from matplotlib.ticker import FuncFormatter

    step = bucket_seconds(ev.send_span)
    edges = _edges(ev.send_span, step)
    which = np.digitize(ev.start, edges) - 1
    fig = Figure(figsize=(9, 4.5))
    ax = fig.add_subplot()
    drawn = False
    for (name, ms), color in zip(ev.latencies_ms().items(), ("C0", "C1", "C2")):
        p50 = np.full(edges.size - 1, np.nan)
        p99 = np.full(edges.size - 1, np.nan)
        for b in range(edges.size - 1):
            values = ms[(which == b) & ~np.isnan(ms)]
            if values.size:
                p50[b], p99[b] = np.percentile(np.maximum(values, 1e-3), [50, 99])
        if np.all(np.isnan(p50)):
            continue
        # baseline=None: no drop to 0 at the ends, which a log axis cannot draw.
        ax.stairs(p50, edges, baseline=None, color=color, linewidth=1.5, label=f"{name} p50")
        ax.stairs(p99, edges, baseline=None, color=color, linewidth=1.0, linestyle="--",
                  label=f"{name} p99")
        drawn = True
    if drawn:
        ax.set_yscale("log")
        ax.yaxis.set_major_formatter(FuncFormatter(lambda y, _: f"{y:,g}"))
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=9)
    else:
        ax.text(0.5, 0.5, "no latencies recorded", ha="center", transform=ax.transAxes)
    ax.set_xlim(0, edges[-1])
    ax.set_xlabel(f"send time since the first send (s, {fmt_seconds(step)} buckets)")
    ax.set_ylabel("latency (ms, log scale)")
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3, which="both")
    return _save(fig, path)


#: Check-back kinds as verify counts them, and the colour a reader should see them in.
CHECK_COLOURS = {"expected": "tab:green", "early": "tab:gray", "raced": "tab:gray",
                 "unexpected": "tab:red", "duplicate": "tab:red"}
#: What the producer was doing when a check arrived, as the over-time panel names it.
CHECK_PHASES = {"undecided": ("undecided half (expected or duplicate)", "tab:green"),
                "running": ("local transaction running (early)", "tab:gray"),
                "decided": ("already decided (raced or unexpected)", "tab:red")}


def checks(ev: Events, counts: dict[str, int], scripted: int, title: str, path: Path | BinaryIO):
    """Left: check-backs by kind against the count the trace scripts.  Right: their arrivals
    over time by the producer's state, where the broker's check passes show as bursts."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(12, 4.5))
    left, right = fig.subplots(1, 2, gridspec_kw={"width_ratios": [1, 1]})
    kinds = list(counts)
    bars = left.bar(kinds, [counts[k] for k in kinds],
                    color=[CHECK_COLOURS.get(k, "tab:blue") for k in kinds])
    left.bar_label(bars, labels=[f"{counts[k]:,}" for k in kinds], fontsize=9)
    left.axhline(scripted, color="black", linestyle="--", linewidth=1,
                 label=f"scripted by the trace: {scripted:,}")
    left.set_ylim(0, max([scripted, *counts.values(), 1]) * 1.15)
    left.tick_params(axis="x", labelsize=9)
    left.set_ylabel("check-backs")
    left.set_xlabel("kind (red: violations)")
    left.legend(loc="upper right", fontsize=9)
    left.grid(axis="y", alpha=0.3)

    step = bucket_seconds(ev.span)
    edges = _edges(ev.span, step)
    bottom = np.zeros(edges.size - 1)
    for phase, (label, colour) in CHECK_PHASES.items():
        per_bucket, _ = np.histogram(ev.check[ev.check_phase == phase], bins=edges)
        if per_bucket.any():
            right.stairs(bottom + per_bucket, edges, baseline=bottom, fill=True, color=colour,
                         alpha=0.8, label=f"{label}: {per_bucket.sum():,}")
            bottom = bottom + per_bucket
    if not bottom.any():
        right.text(0.5, 0.5, "no check-backs", ha="center", transform=right.transAxes)
    else:
        right.set_ylim(0, bottom.max() * 1.2)  # room for the legend
        right.legend(loc="upper right", fontsize=9)
    right.set_xlim(0, edges[-1])
    right.set_xlabel("time since the first send (s)")
    right.set_ylabel(f"check-backs per {fmt_seconds(step)} bucket")
    right.grid(alpha=0.3)
    fig.suptitle(title, fontsize=10)
    return _save(fig, path)
