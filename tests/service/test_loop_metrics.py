"""Loop metrics export exactly what prometheus_client's own counters and histograms do."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, Counter, Histogram

from txbroker.service.loop_metrics import LoopCollector


def _samples(registry: CollectorRegistry) -> dict[tuple, float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in registry.collect() for s in fam.samples if not s.name.endswith("_created")}


def test_histogram_and_counters_match_prometheus_client():
    buckets = (0.005, 0.1, 1, 60)
    values = [0.0, 0.005, 0.0051, 0.1, 0.5, 1, 59.9, 60, 61, 3600]
    ours, theirs = CollectorRegistry(), CollectorRegistry()
    loop = LoopCollector("ns")
    hist = loop.histogram("lat_seconds", "latency", buckets)
    plain = loop.counter("events", "events")
    labelled = loop.counter("ends", "ends", ["source"])
    ours.register(loop)
    ref_hist = Histogram("lat_seconds", "latency", namespace="ns", registry=theirs, buckets=buckets)
    ref_plain = Counter("events", "events", namespace="ns", registry=theirs)
    ref_labelled = Counter("ends", "ends", ["source"], namespace="ns", registry=theirs)
    for v in values:
        hist.observe(v)
        ref_hist.observe(v)
    plain.inc()
    plain.inc(2)
    ref_plain.inc()
    ref_plain.inc(2)
    labelled.labels(source="producer").inc()
    labelled.labels(source="check").inc(4)
    ref_labelled.labels(source="producer").inc()
    ref_labelled.labels(source="check").inc(4)
    assert _samples(ours) == _samples(theirs)


def test_counters_refuse_wrong_labels_and_decrements():
    loop = LoopCollector()
    labelled = loop.counter("ends", "ends", ["source"])
    with pytest.raises(ValueError):
        labelled.labels(kind="x")
    with pytest.raises(ValueError):
        loop.counter("events", "events").inc(-1)
