"""Broker metrics: Prometheus counters, gauges and one histogram, per broker instance.

The transaction counters and the histogram are loop metrics
(:mod:`txbroker.service.loop_metrics`: a plain add, no lock); gauges are prometheus_client's.

Each :class:`BrokerMetrics` owns its own ``CollectorRegistry`` (never prometheus_client's
global one): tests and benchmarks run several brokers in one process, and a global registry
would either refuse the second broker's metrics or mix the two.

The transactional service updates the ``tx_*`` metrics itself; the composition root sets the
store and connection gauges (:meth:`set_broker_gauges`) before each scrape.  The same values
are exported two ways: :meth:`render` (Prometheus text for the HTTP endpoint) and
:meth:`snapshot` (flat string table for GET_BROKER_RUNTIME_INFO's KVTable and BROKER_STATUS).
"""

from __future__ import annotations

from collections.abc import Mapping

from prometheus_client import CollectorRegistry, Gauge, generate_latest

from txbroker.service.loop_metrics import LoopCollector

#: Half-to-decision latency buckets (seconds): from an immediate commit to hours of check-backs.
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900,
                   3600, 6 * 3600, 24 * 3600)
NAMESPACE = "txbroker"


class BrokerMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r, ns = self.registry, NAMESPACE
        # --- transactions: updated on the event loop, several per transaction -------------
        loop = LoopCollector()
        counter, histogram = loop.counter, loop.histogram
        self.halves = counter("tx_halves", "Half messages stored")
        self.retried_halves = counter("tx_retried_halves",
                                      "Half sends answered with the pending half of the same "
                                      "UNIQ_KEY (a retry whose first answer was lost)")
        self.commits = counter("tx_commits", "Half messages committed (final message written)",
                               ["source"])
        self.rollbacks = counter("tx_rollbacks", "Half messages rolled back", ["source"])
        self.unknown_ends = counter("tx_unknown_ends", "END_TRANSACTION with state unknown")
        self.duplicate_ends = counter("tx_duplicate_ends",
                                      "Decisions repeating an applied one (nothing written)")
        self.conflicting_ends = counter("tx_conflicting_ends",
                                        "Decisions refused because they contradict the recorded one")
        self.invalid_ends = counter("tx_invalid_ends",
                                    "END_TRANSACTION refused: no such half, wrong group or offset")
        self.checks_sent = counter("tx_checks_sent", "CHECK_TRANSACTION_STATE requests sent")
        self.checks_lost = counter("tx_checks_lost",
                                   "Checks whose connection closed unanswered (not counted)")
        self.check_answers = counter("tx_check_answers", "Answers to check-backs by kind",
                                     ["kind"])
        self.no_producer = counter("tx_no_producer",
                                   "Due checks not sent: no live connection of the producer group")
        self.discards = counter("tx_discards", "Halves moved to TRANS_CHECK_MAX_TIME_TOPIC")
        self.resumes = counter("tx_resumes", "Discarded halves resumed by an operator")
        self.check_passes = counter("tx_check_passes", "Check passes run")
        self.decision_latency = histogram("tx_decision_latency_seconds",
                                          "Time from half stored to commit or rollback",
                                          LATENCY_BUCKETS)
        # --- Kafka listener (docs/kafka.md) ----------------------------------------------
        self.kafka_requests = counter("kafka_requests", "Kafka requests handled by API", ["api"])
        self.kafka_records_produced = counter("kafka_records_produced",
                                              "Records stored from Kafka Produce requests "
                                              "(transactional ones when committed)")
        self.kafka_records_fetched = counter("kafka_records_fetched",
                                             "Records returned by Kafka Fetch requests")
        self.kafka_duplicate_batches = counter("kafka_duplicate_batches",
                                               "Idempotent batches answered as duplicates "
                                               "(not stored again)")
        self.kafka_txn_started = counter("kafka_txn_started", "Kafka transactions begun")
        self.kafka_txn_committed = counter("kafka_txn_committed", "Kafka transactions committed")
        self.kafka_txn_aborted = counter("kafka_txn_aborted", "Kafka transactions aborted",
                                         ["reason"])  # client, timeout, fenced, operator
        self.kafka_producers_fenced = counter("kafka_producers_fenced",
                                              "Kafka producer epochs fenced by a newer one")
        self.grpc_requests = counter("grpc_requests", "gRPC calls answered, by RPC and the "
                                     "status code of the answer", ["rpc", "code"])
        self.kafka_txn_duration = histogram("kafka_txn_duration_seconds",
                                            "Time from a Kafka transaction's start to its end",
                                            LATENCY_BUCKETS)
        r.register(loop)
        self.kafka_txn_open = Gauge("kafka_txn_open", "Kafka transactions open (ongoing)",
                                    namespace=ns, registry=r)
        self.kafka_groups = Gauge("kafka_groups", "Kafka consumer groups with members",
                                  namespace=ns, registry=r)
        self.pending = Gauge("tx_pending", "Half messages waiting for a decision",
                             namespace=ns, registry=r)
        self.grpc_clients = Gauge("grpc_clients", "RocketMQ 5.x clients known to the gRPC "
                                  "endpoint", namespace=ns, registry=r)
        self.discarded = Gauge("tx_discarded", "Discarded half messages not yet resolved",
                               namespace=ns, registry=r)
        # --- store and connections (set by the composition root) --------------------------
        self.connections = Gauge("connections", "Open client connections", namespace=ns, registry=r)
        self.in_flight = Gauge("requests_in_flight", "Requests being handled", namespace=ns,
                               registry=r)
        self.held_pulls = Gauge("held_pulls", "Long-poll pulls and Kafka fetches waiting for messages",
                                namespace=ns, registry=r)
        self.store = Gauge("store", "Message store figures (puts, gets, bytes, ...)", ["stat"],
                           namespace=ns, registry=r)

    def set_broker_gauges(self, *, connections: int | None = None,
                          store: Mapping[str, object] | None = None,
                          held_pulls: int | None = None, in_flight: int | None = None) -> None:
        """Refresh the gauges the broker owns; ``store`` is ``MessageStore.stats()``.

        Non-numeric store figures (paths, modes) are skipped: a gauge holds numbers only.
        """
        if connections is not None:
            self.connections.set(connections)
        if held_pulls is not None:
            self.held_pulls.set(held_pulls)
        if in_flight is not None:
            self.in_flight.set(in_flight)
        for name, value in (store or {}).items():
            if isinstance(value, bool) or not isinstance(value, int | float):
                continue
            self.store.labels(stat=str(name)).set(value)

    def render(self) -> bytes:
        """Prometheus text exposition format (version 0.0.4)."""
        return generate_latest(self.registry)

    def snapshot(self) -> dict[str, str]:
        """Flat ``name -> value`` strings: counters, gauges, histogram count and sum.

        Names drop the ``txbroker_`` prefix; a labelled sample appends its label values, e.g.
        ``tx_commits_total_producer`` or ``store_puts``.
        """
        out: dict[str, str] = {}
        prefix = NAMESPACE + "_"
        for family in self.registry.collect():
            for sample in family.samples:
                name = sample.name
                if name.endswith(("_created", "_bucket")):
                    continue
                name = name.removeprefix(prefix)
                if sample.labels:
                    name = "_".join([name, *(str(v) for v in sample.labels.values())])
                value = sample.value
                out[name] = str(int(value)) if float(value).is_integer() else f"{value:.6g}"
        return out
