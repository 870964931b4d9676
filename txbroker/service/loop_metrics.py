"""Counters and a histogram for the event-loop thread: a plain add per event, exported to
Prometheus at scrape time by one collector.

prometheus_client's ``Counter.inc`` and ``Histogram.observe`` take a ``threading.Lock`` each
time (they are written for threaded servers).  Every transaction bumps several of them, and
the broker updates them from the event loop only, so the lock is pure cost: about 2 µs per
transaction.  These types keep the same calls (``inc``, ``labels(...)``, ``observe``) and the
same exposition (``<name>_total``, ``_bucket``/``_count``/``_sum``).
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterator, Sequence
from typing import TypeVar

from prometheus_client.metrics_core import (
    CounterMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.utils import floatToGoString


class LoopCounter:
    """A monotonically increasing count; with label names, ``labels(...)`` gives the child
    that counts (the parent itself exports only its children, as prometheus_client does)."""

    def __init__(self, name: str, documentation: str, labelnames: Sequence[str] = ()) -> None:
        self.name = name
        self.documentation = documentation
        self.labelnames = tuple(labelnames)
        self.value = 0.0
        self._children: dict[tuple[str, ...], LoopCounter] = {}

    def inc(self, amount: float = 1) -> None:
        if amount < 0:
            raise ValueError("counters only go up")
        self.value += amount

    def labels(self, **labels: object) -> LoopCounter:
        if set(labels) != set(self.labelnames):
            raise ValueError(f"{self.name} takes labels {self.labelnames}, got {tuple(labels)}")
        key = tuple(str(labels[n]) for n in self.labelnames)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = LoopCounter(self.name, self.documentation)
        return child

    def family(self) -> Metric:
        fam = CounterMetricFamily(self.name, self.documentation, labels=self.labelnames)
        if self.labelnames:
            for key, child in self._children.items():
                fam.add_metric(list(key), child.value)
        else:
            fam.add_metric([], self.value)
        return fam


class LoopHistogram:
    """Observations counted into fixed upper bounds (``le``), plus their sum."""

    def __init__(self, name: str, documentation: str, buckets: Sequence[float]) -> None:
        self.name = name
        self.documentation = documentation
        self.bounds = tuple(sorted(float(b) for b in buckets))
        self.counts = [0] * (len(self.bounds) + 1)  # the last one is +Inf
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1
        self.sum += value

    def family(self) -> Metric:
        cumulative, running = [], 0
        for bound, count in zip((*self.bounds, float("inf")), self.counts, strict=True):
            running += count
            cumulative.append((floatToGoString(bound), running))
        return HistogramMetricFamily(self.name, self.documentation, buckets=cumulative,
                                     sum_value=self.sum)


M = TypeVar("M", "LoopCounter", "LoopHistogram")


class LoopCollector:
    """Makes loop metrics named ``<namespace>_<name>`` and exports them through a
    ``CollectorRegistry`` (``registry.register(collector)``)."""

    def __init__(self, namespace: str = "txbroker") -> None:
        self.prefix = f"{namespace}_" if namespace else ""
        self.metrics: list[LoopCounter | LoopHistogram] = []

    def counter(self, name: str, documentation: str, labelnames: Sequence[str] = ()) -> LoopCounter:
        return self._add(LoopCounter(self.prefix + name, documentation, labelnames))

    def histogram(self, name: str, documentation: str, buckets: Sequence[float]) -> LoopHistogram:
        return self._add(LoopHistogram(self.prefix + name, documentation, buckets))

    def _add(self, metric: M) -> M:
        self.metrics.append(metric)
        return metric

    def collect(self) -> Iterator[Metric]:
        for metric in self.metrics:
            yield metric.family()
