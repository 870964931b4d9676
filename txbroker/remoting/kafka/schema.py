"""Request and response field tables of every API and version txbroker serves, transcribed from
Kafka's message definitions (docs/kafka.md, "Wire codec"), and the generic body codec.

A table is a list of `F` rows in wire order.  Each row names the field in snake_case (the body
dict key), its type, the versions that carry it (Kafka's own notation: "0+", "3", "8-10"), the
versions where it may be null, and its default when a response dict leaves it out.  Every
(api, version, direction) is compiled once, at import, into a list of small closures, so a
request costs one call per field and no table lookups.  In flexible versions strings, bytes,
records and arrays take their compact forms and every struct ends with a tagged-field section
(unknown tags are skipped on decode; none are written)."""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from txbroker.remoting.kafka.apis import SERVED, ApiKey, is_flexible
from txbroker.remoting.kafka.primitives import KafkaDecodeError, Reader, Writer

_MISSING: Any = object()


@dataclass(frozen=True, slots=True)
class F:
    """One field: `type` is int8/int16/int32/int64/bool/string/bytes/records, "[int32]"-style
    for an array of a primitive, or a list of `F` for an array of structs."""

    name: str
    type: str | list[F]
    versions: str = "0+"
    nullable: str | None = None
    default: Any = _MISSING


def _in(spec: str | None, version: int) -> bool:
    if spec is None or spec == "none":  # Kafka writes "none" where no version qualifies
        return False
    if spec.endswith("+"):
        return version >= int(spec[:-1])
    lo, _, hi = spec.partition("-")
    return int(lo) <= version <= int(hi or lo)


# ---------------------------------------------------------------------------------------------
# The tables (request, response) per API, in wire order.

_REQUESTS: dict[ApiKey, list[F]] = {
    ApiKey.PRODUCE: [
        F("transactional_id", "string", "3+", nullable="0+", default=None),
        F("acks", "int16"),
        F("timeout_ms", "int32"),
        F("topic_data", [
            F("name", "string"),
            F("partition_data", [F("index", "int32"), F("records", "records", nullable="0+")]),
        ]),
    ],
    ApiKey.FETCH: [
        F("replica_id", "int32", default=-1),
        F("max_wait_ms", "int32"),
        F("min_bytes", "int32"),
        F("max_bytes", "int32", "3+", default=0x7FFFFFFF),
        F("isolation_level", "int8", "4+"),
        F("session_id", "int32", "7+"),
        F("session_epoch", "int32", "7+", default=-1),
        F("topics", [
            F("topic", "string"),
            F("partitions", [
                F("partition", "int32"),
                F("current_leader_epoch", "int32", "9+", default=-1),
                F("fetch_offset", "int64"),
                F("log_start_offset", "int64", "5+", default=-1),
                F("partition_max_bytes", "int32"),
            ]),
        ]),
        F("forgotten_topics_data", [F("topic", "string"), F("partitions", "[int32]")], "7+"),
        F("rack_id", "string", "11+"),
    ],
    ApiKey.LIST_OFFSETS: [
        F("replica_id", "int32", default=-1),
        F("isolation_level", "int8", "2+"),
        F("topics", [
            F("name", "string"),
            F("partitions", [F("partition_index", "int32"), F("timestamp", "int64")]),
        ]),
    ],
    ApiKey.METADATA: [
        F("topics", [F("name", "string")], nullable="1+"),
        F("allow_auto_topic_creation", "bool", "4+", default=True),
        F("include_cluster_authorized_operations", "bool", "8-10"),
        F("include_topic_authorized_operations", "bool", "8+"),
    ],
    ApiKey.OFFSET_COMMIT: [
        F("group_id", "string"),
        F("generation_id_or_member_epoch", "int32", "1+", default=-1),
        F("member_id", "string", "1+"),
        F("retention_time_ms", "int64", "2-4", default=-1),
        F("topics", [
            F("name", "string"),
            F("partitions", [
                F("partition_index", "int32"),
                F("committed_offset", "int64"),
                F("commit_timestamp", "int64", "1", default=-1),   # Kafka 3.9's definition
                F("committed_metadata", "string", nullable="0+", default=None),
            ]),
        ]),
    ],
    ApiKey.OFFSET_FETCH: [
        F("group_id", "string"),
        F("topics", [F("name", "string"), F("partition_indexes", "[int32]")], nullable="2+"),
        F("require_stable", "bool", "7+", default=False),
    ],
    ApiKey.FIND_COORDINATOR: [
        F("key", "string"),
        F("key_type", "int8", "1+"),
    ],
    ApiKey.JOIN_GROUP: [
        F("group_id", "string"),
        F("session_timeout_ms", "int32"),
        F("rebalance_timeout_ms", "int32", "1+", default=-1),
        F("member_id", "string"),
        F("group_instance_id", "string", "5+", nullable="5+", default=None),
        F("protocol_type", "string"),
        F("protocols", [F("name", "string"), F("metadata", "bytes")]),
    ],
    ApiKey.HEARTBEAT: [
        F("group_id", "string"),
        F("generation_id", "int32"),
        F("member_id", "string"),
        F("group_instance_id", "string", "3+", nullable="3+", default=None),
    ],
    ApiKey.LEAVE_GROUP: [
        F("group_id", "string"),
        F("member_id", "string", "0-2"),
    ],
    ApiKey.SYNC_GROUP: [
        F("group_id", "string"),
        F("generation_id", "int32"),
        F("member_id", "string"),
        F("group_instance_id", "string", "3+", nullable="3+", default=None),
        F("assignments", [F("member_id", "string"), F("assignment", "bytes")]),
    ],
    ApiKey.API_VERSIONS: [
        F("client_software_name", "string", "3+"),
        F("client_software_version", "string", "3+"),
    ],
    ApiKey.CREATE_TOPICS: [
        F("topics", [
            F("name", "string"),
            F("num_partitions", "int32"),
            F("replication_factor", "int16"),
            F("assignments", [F("partition_index", "int32"), F("broker_ids", "[int32]")]),
            F("configs", [F("name", "string"), F("value", "string", nullable="0+", default=None)]),
        ]),
        F("timeout_ms", "int32", default=60000),
        F("validate_only", "bool", "1+"),
    ],
    ApiKey.INIT_PRODUCER_ID: [
        F("transactional_id", "string", nullable="0+", default=None),
        F("transaction_timeout_ms", "int32"),
        F("producer_id", "int64", "3+", default=-1),
        F("producer_epoch", "int16", "3+", default=-1),
    ],
    ApiKey.ADD_PARTITIONS_TO_TXN: [  # Kafka names these V3AndBelow*: the only layout served
        F("transactional_id", "string"),
        F("producer_id", "int64"),
        F("producer_epoch", "int16"),
        F("topics", [F("name", "string"), F("partitions", "[int32]")]),
    ],
    ApiKey.ADD_OFFSETS_TO_TXN: [
        F("transactional_id", "string"),
        F("producer_id", "int64"),
        F("producer_epoch", "int16"),
        F("group_id", "string"),
    ],
    ApiKey.END_TXN: [
        F("transactional_id", "string"),
        F("producer_id", "int64"),
        F("producer_epoch", "int16"),
        F("committed", "bool"),
    ],
    ApiKey.WRITE_TXN_MARKERS: [  # between brokers (docs/kafka.md, "Kafka on a cluster")
        F("markers", [
            F("producer_id", "int64"),
            F("producer_epoch", "int16"),
            F("transaction_result", "bool"),
            F("topics", [F("name", "string"), F("partition_indexes", "[int32]")]),
            F("coordinator_epoch", "int32"),
        ]),
    ],
    ApiKey.TXN_OFFSET_COMMIT: [
        F("transactional_id", "string"),
        F("group_id", "string"),
        F("producer_id", "int64"),
        F("producer_epoch", "int16"),
        F("generation_id", "int32", "3+", default=-1),
        F("member_id", "string", "3+"),
        F("group_instance_id", "string", "3+", nullable="3+", default=None),
        F("topics", [
            F("name", "string"),
            F("partitions", [
                F("partition_index", "int32"),
                F("committed_offset", "int64"),
                F("committed_leader_epoch", "int32", "2+", default=-1),
                F("committed_metadata", "string", nullable="0+", default=None),
            ]),
        ]),
    ],
    ApiKey.DESCRIBE_TRANSACTIONS: [
        F("transactional_ids", "[string]"),
    ],
    ApiKey.LIST_TRANSACTIONS: [
        F("state_filters", "[string]"),
        F("producer_id_filters", "[int64]"),
        F("duration_filter", "int64", "1+", default=-1),
    ],
    ApiKey.DELETE_TOPICS: [
        F("topic_names", "[string]"),
        F("timeout_ms", "int32"),
    ],
    ApiKey.DESCRIBE_CONFIGS: [
        F("resources", [
            F("resource_type", "int8"),
            F("resource_name", "string"),
            F("configuration_keys", "[string]", nullable="0+", default=None),
        ]),
        F("include_synonyms", "bool", "1+"),
        F("include_documentation", "bool", "3+"),
    ],
    ApiKey.ALTER_CONFIGS: [
        F("resources", [
            F("resource_type", "int8"),
            F("resource_name", "string"),
            F("configs", [F("name", "string"), F("value", "string", nullable="0+", default=None)]),
        ]),
        F("validate_only", "bool"),
    ],
    ApiKey.CREATE_PARTITIONS: [
        F("topics", [
            F("name", "string"),
            F("count", "int32"),
            F("assignments", [F("broker_ids", "[int32]")], nullable="0+", default=None),
        ]),
        F("timeout_ms", "int32"),
        F("validate_only", "bool"),
    ],
    ApiKey.INCREMENTAL_ALTER_CONFIGS: [
        F("resources", [
            F("resource_type", "int8"),
            F("resource_name", "string"),
            F("configs", [
                F("name", "string"),
                F("config_operation", "int8"),
                F("value", "string", nullable="0+", default=None),
            ]),
        ]),
        F("validate_only", "bool"),
    ],
    ApiKey.DESCRIBE_CLUSTER: [
        F("include_cluster_authorized_operations", "bool"),
        F("endpoint_type", "int8", "1+", default=1),
        F("include_fenced_brokers", "bool", "2+"),
    ],
    ApiKey.DESCRIBE_PRODUCERS: [
        F("topics", [F("name", "string"), F("partition_indexes", "[int32]")]),
    ],
    ApiKey.DESCRIBE_GROUPS: [
        F("groups", "[string]"),
        F("include_authorized_operations", "bool", "3+"),
    ],
    ApiKey.LIST_GROUPS: [
        F("states_filter", "[string]", "4+"),
        F("types_filter", "[string]", "5+"),
    ],
    ApiKey.DELETE_GROUPS: [
        F("groups_names", "[string]"),
    ],
    ApiKey.SASL_HANDSHAKE: [F("mechanism", "string")],
    ApiKey.SASL_AUTHENTICATE: [F("auth_bytes", "bytes")],
    ApiKey.DESCRIBE_ACLS: [
        F("resource_type_filter", "int8"),
        F("resource_name_filter", "string", nullable="0+", default=None),
        F("pattern_type_filter", "int8", "1+", default=3),
        F("principal_filter", "string", nullable="0+", default=None),
        F("host_filter", "string", nullable="0+", default=None),
        F("operation", "int8"),
        F("permission_type", "int8"),
    ],
    ApiKey.CREATE_ACLS: [
        F("creations", [
            F("resource_type", "int8"),
            F("resource_name", "string"),
            F("resource_pattern_type", "int8", "1+", default=3),
            F("principal", "string"),
            F("host", "string"),
            F("operation", "int8"),
            F("permission_type", "int8"),
        ]),
    ],
    ApiKey.DELETE_ACLS: [
        F("filters", [
            F("resource_type_filter", "int8"),
            F("resource_name_filter", "string", nullable="0+", default=None),
            F("pattern_type_filter", "int8", "1+", default=3),
            F("principal_filter", "string", nullable="0+", default=None),
            F("host_filter", "string", nullable="0+", default=None),
            F("operation", "int8"),
            F("permission_type", "int8"),
        ]),
    ],
}

_RESPONSES: dict[ApiKey, list[F]] = {
    ApiKey.PRODUCE: [
        F("responses", [
            F("name", "string"),
            F("partition_responses", [
                F("index", "int32"),
                F("error_code", "int16"),
                F("base_offset", "int64"),
                F("log_append_time_ms", "int64", "2+", default=-1),
                F("log_start_offset", "int64", "5+", default=-1),
            ]),
        ]),
        F("throttle_time_ms", "int32", "1+"),
    ],
    ApiKey.FETCH: [
        F("throttle_time_ms", "int32", "1+"),
        F("error_code", "int16", "7+"),
        F("session_id", "int32", "7+"),
        F("responses", [
            F("topic", "string"),
            F("partitions", [
                F("partition_index", "int32"),
                F("error_code", "int16"),
                F("high_watermark", "int64"),
                F("last_stable_offset", "int64", "4+", default=-1),
                F("log_start_offset", "int64", "5+", default=-1),
                F("aborted_transactions", [F("producer_id", "int64"), F("first_offset", "int64")],
                  "4+", nullable="4+"),
                F("preferred_read_replica", "int32", "11+", default=-1),
                F("records", "records", nullable="0+"),
            ]),
        ]),
    ],
    ApiKey.LIST_OFFSETS: [
        F("throttle_time_ms", "int32", "2+"),
        F("topics", [
            F("name", "string"),
            F("partitions", [
                F("partition_index", "int32"),
                F("error_code", "int16"),
                F("timestamp", "int64", "1+", default=-1),
                F("offset", "int64", "1+", default=-1),
            ]),
        ]),
    ],
    ApiKey.METADATA: [
        F("throttle_time_ms", "int32", "3+"),
        F("brokers", [
            F("node_id", "int32"),
            F("host", "string"),
            F("port", "int32"),
            F("rack", "string", "1+", nullable="1+", default=None),
        ]),
        F("cluster_id", "string", "2+", nullable="2+", default=None),
        F("controller_id", "int32", "1+", default=-1),
        F("topics", [
            F("error_code", "int16"),
            F("name", "string", nullable="12+"),
            F("is_internal", "bool", "1+"),
            F("partitions", [
                F("error_code", "int16"),
                F("partition_index", "int32"),
                F("leader_id", "int32"),
                F("leader_epoch", "int32", "7+", default=-1),
                F("replica_nodes", "[int32]"),
                F("isr_nodes", "[int32]"),
                F("offline_replicas", "[int32]", "5+"),
            ]),
            F("topic_authorized_operations", "int32", "8+", default=-2147483648),
        ]),
        F("cluster_authorized_operations", "int32", "8-10", default=-2147483648),
    ],
    ApiKey.OFFSET_COMMIT: [
        F("throttle_time_ms", "int32", "3+"),
        F("topics", [
            F("name", "string"),
            F("partitions", [F("partition_index", "int32"), F("error_code", "int16")]),
        ]),
    ],
    ApiKey.OFFSET_FETCH: [
        F("throttle_time_ms", "int32", "3+"),
        F("topics", [
            F("name", "string"),
            F("partitions", [
                F("partition_index", "int32"),
                F("committed_offset", "int64", default=-1),
                F("committed_leader_epoch", "int32", "5+", default=-1),
                F("metadata", "string", nullable="0+", default=None),
                F("error_code", "int16"),
            ]),
        ]),
        F("error_code", "int16", "2+"),
    ],
    ApiKey.FIND_COORDINATOR: [
        F("throttle_time_ms", "int32", "1+"),
        F("error_code", "int16"),
        F("error_message", "string", "1+", nullable="1+", default=None),
        F("node_id", "int32"),
        F("host", "string"),
        F("port", "int32"),
    ],
    ApiKey.JOIN_GROUP: [
        F("throttle_time_ms", "int32", "2+"),
        F("error_code", "int16"),
        F("generation_id", "int32", default=-1),
        F("protocol_name", "string"),
        F("leader", "string"),
        F("member_id", "string"),
        F("members", [
            F("member_id", "string"),
            F("group_instance_id", "string", "5+", nullable="5+", default=None),
            F("metadata", "bytes"),
        ]),
    ],
    ApiKey.HEARTBEAT: [
        F("throttle_time_ms", "int32", "1+"),
        F("error_code", "int16"),
    ],
    ApiKey.LEAVE_GROUP: [
        F("throttle_time_ms", "int32", "1+"),
        F("error_code", "int16"),
    ],
    ApiKey.SYNC_GROUP: [
        F("throttle_time_ms", "int32", "1+"),
        F("error_code", "int16"),
        F("assignment", "bytes"),
    ],
    ApiKey.API_VERSIONS: [
        F("error_code", "int16"),
        F("api_keys", [F("api_key", "int16"), F("min_version", "int16"), F("max_version", "int16")]),
        F("throttle_time_ms", "int32", "1+"),
    ],
    ApiKey.CREATE_TOPICS: [
        F("throttle_time_ms", "int32", "2+"),
        F("topics", [
            F("name", "string"),
            F("error_code", "int16"),
            F("error_message", "string", "1+", nullable="0+", default=None),
        ]),
    ],
    ApiKey.INIT_PRODUCER_ID: [
        F("throttle_time_ms", "int32"),
        F("error_code", "int16"),
        F("producer_id", "int64", default=-1),
        F("producer_epoch", "int16"),
    ],
    ApiKey.ADD_PARTITIONS_TO_TXN: [  # Kafka's ResultsByTopicV3AndBelow / ResultsByPartition
        F("throttle_time_ms", "int32"),
        F("results", [
            F("name", "string"),
            F("results", [F("partition_index", "int32"), F("partition_error_code", "int16")]),
        ]),
    ],
    ApiKey.ADD_OFFSETS_TO_TXN: [
        F("throttle_time_ms", "int32"),
        F("error_code", "int16"),
    ],
    ApiKey.END_TXN: [
        F("throttle_time_ms", "int32"),
        F("error_code", "int16"),
    ],
    ApiKey.WRITE_TXN_MARKERS: [
        F("markers", [
            F("producer_id", "int64"),
            F("topics", [
                F("name", "string"),
                F("partitions", [F("partition_index", "int32"), F("error_code", "int16")]),
            ]),
        ]),
    ],
    ApiKey.TXN_OFFSET_COMMIT: [
        F("throttle_time_ms", "int32"),
        F("topics", [
            F("name", "string"),
            F("partitions", [F("partition_index", "int32"), F("error_code", "int16")]),
        ]),
    ],
    ApiKey.DESCRIBE_TRANSACTIONS: [
        F("throttle_time_ms", "int32"),
        F("transaction_states", [
            F("error_code", "int16"),
            F("transactional_id", "string"),
            F("transaction_state", "string"),
            F("transaction_timeout_ms", "int32"),
            F("transaction_start_time_ms", "int64"),
            F("producer_id", "int64"),
            F("producer_epoch", "int16"),
            F("topics", [F("topic", "string"), F("partitions", "[int32]")]),
        ]),
    ],
    ApiKey.LIST_TRANSACTIONS: [
        F("throttle_time_ms", "int32"),
        F("error_code", "int16"),
        F("unknown_state_filters", "[string]"),
        F("transaction_states", [
            F("transactional_id", "string"),
            F("producer_id", "int64"),
            F("transaction_state", "string"),
        ]),
    ],
    ApiKey.DELETE_TOPICS: [
        F("throttle_time_ms", "int32", "1+"),
        F("responses", [
            F("name", "string"),
            F("error_code", "int16"),
            F("error_message", "string", "5+", nullable="5+", default=None),
        ]),
    ],
    ApiKey.DESCRIBE_CONFIGS: [
        F("throttle_time_ms", "int32"),
        F("results", [
            F("error_code", "int16"),
            F("error_message", "string", nullable="0+", default=None),
            F("resource_type", "int8"),
            F("resource_name", "string"),
            F("configs", [
                F("name", "string"),
                F("value", "string", nullable="0+", default=None),
                F("read_only", "bool"),
                F("is_default", "bool", "0"),                       # Kafka 3.9's definition
                F("config_source", "int8", "1+", default=-1),
                F("is_sensitive", "bool"),
                F("synonyms", [
                    F("name", "string"),
                    F("value", "string", nullable="0+", default=None),
                    F("source", "int8"),
                ], "1+"),
                F("config_type", "int8", "3+"),
                F("documentation", "string", "3+", nullable="0+", default=None),
            ]),
        ]),
    ],
    ApiKey.ALTER_CONFIGS: [
        F("throttle_time_ms", "int32"),
        F("responses", [
            F("error_code", "int16"),
            F("error_message", "string", nullable="0+", default=None),
            F("resource_type", "int8"),
            F("resource_name", "string"),
        ]),
    ],
    ApiKey.CREATE_PARTITIONS: [
        F("throttle_time_ms", "int32"),
        F("results", [
            F("name", "string"),
            F("error_code", "int16"),
            F("error_message", "string", nullable="0+", default=None),
        ]),
    ],
    ApiKey.INCREMENTAL_ALTER_CONFIGS: [
        F("throttle_time_ms", "int32"),
        F("responses", [
            F("error_code", "int16"),
            F("error_message", "string", nullable="0+", default=None),
            F("resource_type", "int8"),
            F("resource_name", "string"),
        ]),
    ],
    ApiKey.DESCRIBE_CLUSTER: [
        F("throttle_time_ms", "int32"),
        F("error_code", "int16"),
        F("error_message", "string", nullable="0+", default=None),
        F("endpoint_type", "int8", "1+", default=1),
        F("cluster_id", "string"),
        F("controller_id", "int32", default=-1),
        F("brokers", [
            F("broker_id", "int32"),
            F("host", "string"),
            F("port", "int32"),
            F("rack", "string", nullable="0+", default=None),
            F("is_fenced", "bool", "2+"),
        ]),
        F("cluster_authorized_operations", "int32", default=-2147483648),
    ],
    ApiKey.DESCRIBE_PRODUCERS: [
        F("throttle_time_ms", "int32"),
        F("topics", [
            F("name", "string"),
            F("partitions", [
                F("partition_index", "int32"),
                F("error_code", "int16"),
                F("error_message", "string", nullable="0+", default=None),
                F("active_producers", [
                    F("producer_id", "int64"),
                    F("producer_epoch", "int32"),
                    F("last_sequence", "int32", default=-1),
                    F("last_timestamp", "int64", default=-1),
                    F("coordinator_epoch", "int32"),
                    F("current_txn_start_offset", "int64", default=-1),
                ]),
            ]),
        ]),
    ],
    ApiKey.DESCRIBE_GROUPS: [
        F("throttle_time_ms", "int32", "1+"),
        F("groups", [
            F("error_code", "int16"),
            F("group_id", "string"),
            F("group_state", "string"),
            F("protocol_type", "string"),
            F("protocol_data", "string"),
            F("members", [
                F("member_id", "string"),
                F("group_instance_id", "string", "4+", nullable="4+", default=None),
                F("client_id", "string"),
                F("client_host", "string"),
                F("member_metadata", "bytes"),
                F("member_assignment", "bytes"),
            ]),
            F("authorized_operations", "int32", "3+", default=-2147483648),
        ]),
    ],
    ApiKey.LIST_GROUPS: [
        F("throttle_time_ms", "int32", "1+"),
        F("error_code", "int16"),
        F("groups", [
            F("group_id", "string"),
            F("protocol_type", "string"),
            F("group_state", "string", "4+"),
            F("group_type", "string", "5+"),
        ]),
    ],
    ApiKey.DELETE_GROUPS: [
        F("throttle_time_ms", "int32"),
        F("results", [F("group_id", "string"), F("error_code", "int16")]),
    ],
    ApiKey.SASL_HANDSHAKE: [F("error_code", "int16"), F("mechanisms", "[string]")],
    ApiKey.SASL_AUTHENTICATE: [
        F("error_code", "int16"),
        F("error_message", "string", nullable="0+", default=None),
        F("auth_bytes", "bytes"),
        F("session_lifetime_ms", "int64", "1+"),
    ],
    ApiKey.DESCRIBE_ACLS: [
        F("throttle_time_ms", "int32"),
        F("error_code", "int16"),
        F("error_message", "string", nullable="0+", default=None),
        F("resources", [
            F("resource_type", "int8"),
            F("resource_name", "string"),
            F("pattern_type", "int8", "1+", default=3),
            F("acls", [
                F("principal", "string"),
                F("host", "string"),
                F("operation", "int8"),
                F("permission_type", "int8"),
            ]),
        ]),
    ],
    ApiKey.CREATE_ACLS: [
        F("throttle_time_ms", "int32"),
        F("results", [
            F("error_code", "int16"),
            F("error_message", "string", nullable="0+", default=None),
        ]),
    ],
    ApiKey.DELETE_ACLS: [
        F("throttle_time_ms", "int32"),
        F("filter_results", [
            F("error_code", "int16"),
            F("error_message", "string", nullable="0+", default=None),
            F("matching_acls", [
                F("error_code", "int16"),
                F("error_message", "string", nullable="0+", default=None),
                F("resource_type", "int8"),
                F("resource_name", "string"),
                F("pattern_type", "int8", "1+", default=3),
                F("principal", "string"),
                F("host", "string"),
                F("operation", "int8"),
                F("permission_type", "int8"),
            ]),
        ]),
    ],
}

# ---------------------------------------------------------------------------------------------
# Compilation into closures.

Decoder = Callable[[Reader], Any]
Encoder = Callable[[Writer, Any], None]

_INTS = {"int8": (Reader.int8, Writer.int8), "int16": (Reader.int16, Writer.int16),
         "int32": (Reader.int32, Writer.int32), "int64": (Reader.int64, Writer.int64),
         "bool": (Reader.bool, Writer.bool)}


def _scalar(kind: str, nullable: bool, flexible: bool) -> tuple[Decoder, Encoder, Any]:
    """(decode, encode, default) of one scalar type."""
    if kind in _INTS:
        dec, enc = _INTS[kind]
        return dec, enc, (False if kind == "bool" else 0)
    if kind == "string":
        if flexible:
            pair = ((Reader.compact_nullable_string, Writer.compact_nullable_string) if nullable
                    else (Reader.compact_string, Writer.compact_string))
        else:
            pair = ((Reader.nullable_string, Writer.nullable_string) if nullable
                    else (Reader.string, Writer.string))
        return pair[0], pair[1], (None if nullable else "")
    if kind in ("bytes", "records"):
        if flexible:
            pair = ((Reader.compact_nullable_bytes, Writer.compact_nullable_bytes) if nullable
                    else (Reader.compact_bytes, Writer.compact_bytes))
        else:
            pair = ((Reader.nullable_bytes, Writer.nullable_bytes) if nullable
                    else (Reader.bytes, Writer.bytes))
        return pair[0], pair[1], (None if nullable else b"")
    raise ValueError(f"unknown field type {kind!r}")


def _array_encoder(write_array: Callable[..., None], item_enc: Encoder) -> Encoder:
    def enc(w: Writer, v: Any) -> None:
        write_array(w, v, item_enc)
    return enc


def _field(f: F, version: int, flexible: bool) -> tuple[Decoder, Encoder, Any]:
    nullable = _in(f.nullable, version)
    what = f.name
    if isinstance(f.type, list) or f.type.startswith("["):
        if isinstance(f.type, list):
            item_dec, item_enc = _struct(f.type, version, flexible)
        else:
            d, e, _ = _scalar(f.type[1:-1], False, flexible)
            item_dec, item_enc = d, e
        read_array = Reader.compact_array if flexible else Reader.array
        enc = _array_encoder(Writer.compact_array if flexible else Writer.array, item_enc)

        def dec(r: Reader) -> Any:
            start = r.pos
            v = read_array(r, item_dec, what)
            if v is None and not nullable:
                raise KafkaDecodeError(what, start, "null where an array is required")
            return v
        default = None if nullable else []
    else:
        sdec, enc, default = _scalar(f.type, nullable, flexible)

        def dec(r: Reader) -> Any:
            return sdec(r, what)
    if f.default is not _MISSING:
        default = f.default
    return dec, enc, default


def _struct(fields: list[F], version: int, flexible: bool) -> tuple[Decoder, Encoder]:
    compiled = [(f.name, *_field(f, version, flexible)) for f in fields if _in(f.versions, version)]
    decoders = [(name, dec) for name, dec, _, _ in compiled]
    encoders = [(name, enc, default) for name, _, enc, default in compiled]

    if flexible:
        def decode(r: Reader) -> dict:
            d = {name: dec(r) for name, dec in decoders}
            r.skip_tagged_fields()
            return d

        def encode(w: Writer, d: dict) -> None:
            get = d.get
            for name, enc, default in encoders:
                enc(w, get(name, default))
            w.buf.append(0)
    else:
        def decode(r: Reader) -> dict:
            return {name: dec(r) for name, dec in decoders}

        def encode(w: Writer, d: dict) -> None:
            get = d.get
            for name, enc, default in encoders:
                enc(w, get(name, default))
    return decode, encode


def _compile() -> dict[tuple[int, int, bool], tuple[Decoder, Encoder]]:
    out: dict[tuple[int, int, bool], tuple[Decoder, Encoder]] = {}
    for key, (lo, hi) in SERVED.items():
        for version in range(lo, hi + 1):
            flexible = is_flexible(key, version)
            out[(int(key), version, True)] = _struct(_REQUESTS[key], version, flexible)
            out[(int(key), version, False)] = _struct(_RESPONSES[key], version, flexible)
    return out


_COMPILED = _compile()


def fields(api_key: int, is_request: bool) -> list[F]:
    """The field table of one API (all versions), for documentation and tests."""
    return (_REQUESTS if is_request else _RESPONSES)[ApiKey(api_key)]


def has_schema(api_key: int, version: int) -> bool:
    return (api_key, version, True) in _COMPILED


def decode_body(api_key: int, version: int, is_request: bool, reader: Reader) -> dict:
    """Decodes one request or response body at `reader`; KafkaDecodeError when malformed,
    KeyError when (api_key, version) is not served."""
    return _COMPILED[(api_key, version, is_request)][0](reader)


def encode_body(api_key: int, version: int, is_request: bool, body: dict,
                writer: Writer | None = None) -> Writer:
    """Encodes a body dict; absent fields take their defaults.  A value of the wrong type
    (e.g. None in a non-nullable field) raises ValueError naming the API and version."""
    w = Writer() if writer is None else writer
    try:
        _COMPILED[(api_key, version, is_request)][1](w, body)
    except (AttributeError, TypeError, struct.error) as e:
        side = "request" if is_request else "response"
        raise ValueError(f"cannot encode {ApiKey(api_key).name} v{version} {side}: {e}") from e
    return w
