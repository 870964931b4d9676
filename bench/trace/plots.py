"""The report's plots, drawn from ``verify.json``'s aggregates (per-bucket counts, latency
histograms), never from per-transaction rows: a report of ten million transactions costs the
driver what one of a thousand does.

Every time axis counts seconds from a run's first send and is cut into buckets of
:func:`bucket_seconds` (chosen by verify from the run's length, so a short run gets sub-second
buckets and a long one coarser ones); counts are drawn as steps (a bucket is an interval, a line
between bucket values would invent the values in between).  Each time plot marks the faults the
run went through as labelled spans.  One figure holds one or two protocols (``Series`` /
``Panel``: a label and that protocol's aggregates).  matplotlib's ``Figure`` is used without
pyplot: no display, no global state.
"""

from __future__ import annotations

import math
import textwrap
from dataclasses import dataclass, field
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
class Fault:
    """A fault of the run, in seconds since its first send."""

    start: float
    end: float
    label: str


@dataclass
class Panel:
    """One protocol's time series: ``verify.json``'s ``timeline`` (or ``check_timeline``) with
    its bucket width, and the faults to mark."""

    label: str
    timeline: list[dict]
    step: float
    faults: list[Fault] = field(default_factory=list)

    @property
    def edges(self) -> np.ndarray:
        return np.arange(len(self.timeline) + 1) * self.step

    def column(self, name: str) -> np.ndarray:
        return np.array([np.nan if b.get(name) is None else b[name] for b in self.timeline], dtype=float)


@dataclass
class Series:
    """One distribution to draw: a latency histogram of ``verify.json`` and its percentiles."""

    label: str
    hist: dict
    p50: float | None = None
    p99: float | None = None
    style: str = "-"
    colour: str | None = None

    @property
    def n(self) -> int:
        return int(sum(self.hist["counts"]) + self.hist.get("under", 0) + self.hist.get("over", 0))

    def cdf(self) -> tuple[np.ndarray, np.ndarray]:
        """Fraction of values ≤ each bin edge (values under the first edge count at it)."""
        counts = np.asarray(self.hist["counts"], dtype=float)
        below = self.hist.get("under", 0) + np.concatenate([[0.0], np.cumsum(counts)])
        return np.asarray(self.hist["edges"], dtype=float), below / max(self.n, 1)


def _title(text: str) -> str:
    """A title broken into lines that fit the figure's width."""
    return textwrap.fill(text, 105)


def _save(fig, path: Path | BinaryIO) -> Path | BinaryIO:
    fig.tight_layout()
    fig.savefig(path, dpi=_DPI, format="png")
    return path


def _mark_faults(ax, faults: list[Fault]) -> None:
    """Each fault as a shaded span, labelled at the top of the axes."""
    for f in faults:
        ax.axvspan(f.start, f.end, color="tab:red", alpha=0.12, linewidth=0)
        ax.axvline(f.start, color="tab:red", linewidth=1)
        ax.text(f.start, 0.98, f" {f.label}", transform=ax.get_xaxis_transform(), ha="left",
                va="top", fontsize=8, color="tab:red")


def _common_end(panels: list[Panel]) -> float:
    """One time range for every panel, so the protocols' runs compare at a glance."""
    return max(float(p.edges[-1]) for p in panels)


def _panels(n: int, height: float = 3.2):
    from matplotlib.figure import Figure

    fig = Figure(figsize=(9, max(4.5, height * n)))
    axes = fig.subplots(n, 1, squeeze=False)[:, 0]
    return fig, axes


def throughput(panels: list[Panel], title: str, path: Path | BinaryIO):
    """Per protocol: transactions started, committed and fully delivered per second over time."""
    fig, axes = _panels(len(panels))
    for ax, p in zip(axes, panels):
        edges = p.edges
        for name, label, width in (("started", "started", 1.0),
                                   ("committed", "committed (commit sent)", 1.5),
                                   ("delivered", "delivered (every message received)", 1.5)):
            ax.stairs(np.nan_to_num(p.column(name)) / p.step, edges, label=label, linewidth=width)
        _mark_faults(ax, p.faults)
        ax.set_xlim(0, _common_end(panels))
        ax.set_ylim(bottom=0)
        ax.set_xlabel(f"{p.label}: time since the first send (s)")
        ax.set_ylabel(f"transactions / s\n({fmt_seconds(p.step)} buckets)")
        ax.grid(alpha=0.3)
        ax.legend(loc="upper right", fontsize=8, title=p.label, title_fontsize=9)
    fig.suptitle(_title(title), fontsize=10)
    return _save(fig, path)


#: Fractions labelled on a latency distribution's logit axis.
_FRACTION_TICKS = (0.0001, 0.001, 0.01, 0.1, 0.5, 0.9, 0.99, 0.999, 0.9999)


def latency_cdf(series: list[Series], title: str, path: Path | BinaryIO,
                xlabel: str = "ms since the transaction was started (log scale)", logit: bool = True):
    """Cumulative distributions from histograms on a log time axis; with ``logit`` a logit
    fraction axis, which gives p50, p90, p99 and p99.9 equal room, so the tail is as legible
    as the median."""
    from matplotlib.figure import Figure
    from matplotlib.ticker import FuncFormatter, NullFormatter

    fig = Figure(figsize=(9, 4.5))
    ax = fig.add_subplot()
    drawn = [s for s in series if s.n]
    most = max([1, *[s.n for s in drawn]])
    edge = 0.5 / most
    for s in drawn:
        x, y = s.cdf()
        # From the edge before the first value to the edge where the last one is counted: the
        # empty bins outside would draw a flat line at 0 % and 100 % across the whole axis.
        first, last = int(np.argmax(y > 0)), int(np.argmax(y >= y[-1]))
        x, y = x[max(first - 1, 0):last + 1], y[max(first - 1, 0):last + 1]
        label = f"{s.label}: n={s.n:,}"
        if s.p50 is not None:
            label += f", p50 {s.p50:,.1f} ms, p99 {s.p99:,.1f} ms"
        ax.plot(x, np.clip(y, edge, 1 - edge) if logit else y, s.style,
                color=s.colour, label=label, linewidth=1.5)
    if drawn:
        ax.set_xscale("log")
        ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _: f"{x:,g}"))
        if logit:
            ax.set_yscale("logit")
            ticks = [q for q in _FRACTION_TICKS if edge <= q <= 1 - edge]
            ax.set_ylim(edge * 0.8, 1 - edge * 0.8)
            ax.set_yticks(ticks, [f"{q * 100:g}%" for q in ticks])
            ax.yaxis.set_minor_formatter(NullFormatter())
        else:
            ax.set_ylim(0, 1.02)
        ax.legend(loc="lower right", fontsize=8)
    else:
        ax.text(0.5, 0.5, "nothing recorded", ha="center", transform=ax.transAxes)
    ax.set_xlabel(xlabel)
    ax.set_ylabel("fraction ≤ x" + (" (logit scale)" if logit else ""))
    ax.set_title(_title(title), fontsize=10)
    ax.grid(alpha=0.3, which="both")
    return _save(fig, path)


def latency_over_time(panels: list[Panel], title: str, path: Path | BinaryIO):
    """Per protocol, end-to-end p50 and p99 per bucket of start time: a slowdown shows where
    it happened (and against which fault), which one distribution over the run hides."""
    from matplotlib.ticker import FuncFormatter, NullFormatter

    fig, axes = _panels(len(panels))
    # Shared axes: the last start bucket of any run, and one latency range for both designs.
    last_start = max(p.step * (int(np.flatnonzero(np.nan_to_num(p.column("started")))[-1]) + 1)
                     if np.nan_to_num(p.column("started")).any() else p.step for p in panels)
    values = np.concatenate([np.concatenate([p.column("e2e_p50_ms"), p.column("e2e_p99_ms")])
                             for p in panels])
    values = np.maximum(values[~np.isnan(values)], 1e-3)
    for ax, p in zip(axes, panels):
        p50, p99 = p.column("e2e_p50_ms"), p.column("e2e_p99_ms")
        if np.all(np.isnan(p50)):
            ax.text(0.5, 0.5, "no transaction delivered", ha="center", transform=ax.transAxes)
        else:
            # baseline=None: no drop to 0 at the ends, which a log axis cannot draw.
            ax.stairs(np.maximum(p50, 1e-3), p.edges, baseline=None, linewidth=1.5, label="p50")
            ax.stairs(np.maximum(p99, 1e-3), p.edges, baseline=None, linewidth=1.0,
                      linestyle="--", label="p99")
            ax.set_yscale("log")
            ax.set_ylim(values.min() / 1.5, values.max() * 1.5)
            ax.yaxis.set_major_formatter(FuncFormatter(lambda y, _: f"{y:,g}"))
            ax.yaxis.set_minor_formatter(NullFormatter())
            ax.legend(loc="upper right", fontsize=8, title=p.label, title_fontsize=9)
        _mark_faults(ax, p.faults)
        ax.set_xlim(0, last_start)
        ax.set_xlabel(f"{p.label}: start time since the first send (s, {fmt_seconds(p.step)} buckets)")
        ax.set_ylabel("end-to-end latency\n(ms, log scale)")
        ax.grid(alpha=0.3, which="both")
    fig.suptitle(_title(title), fontsize=10)
    return _save(fig, path)


#: Check-back kinds as verify counts them, and the colour a reader should see them in.
CHECK_COLOURS = {"expected": "tab:green", "early": "tab:gray", "raced": "tab:gray",
                 "unexpected": "tab:red", "duplicate": "tab:red"}
#: What the producer was doing when a check arrived, as the over-time panel names it.
CHECK_PHASES = {"undecided": ("undecided half (expected or duplicate)", "tab:green"),
                "running": ("local transaction running (early)", "tab:gray"),
                "decided": ("already decided (raced or unexpected)", "tab:red")}


def checks(counts: dict[str, int], scripted: int, panel: Panel | None, title: str,
           path: Path | BinaryIO):
    """Left: check-backs by kind against the count the trace scripts.  Right: their arrivals
    over time by the producer's state (``panel`` holds ``check_timeline``), where the broker's
    check passes show as bursts.  ``panel`` None: no RocketMQ run, nothing to draw."""
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

    edges = panel.edges if panel is not None else np.array([0.0, 1.0])
    bottom = np.zeros(edges.size - 1)
    for phase, (label, colour) in CHECK_PHASES.items():
        per_bucket = np.nan_to_num(panel.column(phase)) if panel is not None else bottom * 0
        if per_bucket.any():
            right.stairs(bottom + per_bucket, edges, baseline=bottom, fill=True, color=colour,
                         alpha=0.8, label=f"{label}: {int(per_bucket.sum()):,}")
            bottom = bottom + per_bucket
    if not bottom.any():
        right.text(0.5, 0.5, "no check-backs", ha="center", transform=right.transAxes)
    else:
        right.set_ylim(0, bottom.max() * 1.2)  # room for the legend
        right.legend(loc="upper right", fontsize=9)
    if panel is not None:
        _mark_faults(right, panel.faults)
    right.set_xlim(0, edges[-1])
    right.set_xlabel("time since the first send (s)")
    step = panel.step if panel is not None else 1.0
    right.set_ylabel(f"check-backs per {fmt_seconds(step)} bucket")
    right.grid(alpha=0.3)
    fig.suptitle(_title(title), fontsize=10)
    return _save(fig, path)
