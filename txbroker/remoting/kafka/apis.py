"""The Kafka APIs txbroker serves and the versions it advertises (docs/kafka.md, "Versions").

Only versions implemented in full are advertised.  Two ranges start lower than what is
served, on purpose: Produce is advertised from 0 (older librdkafka turns gzip/snappy/lz4 off
unless Produce 0 is in the range, as Apache Kafka 4 also does) but only 3-7 are served, a
request below 3 closes the connection; Fetch starts at 4, the first version with isolation
levels.

OffsetCommit, DescribeConfigs and the three ACL APIs are served from 0, below Kafka 4 (which
kept 2+, 1+ and 1+): sarama 1.22, Debian's Go client, commits with OffsetCommit v1 unless a
retention time is configured, and its admin sends v0 of DescribeConfigs (DescribeConfig,
ListTopics) and of the ACL APIs."""

from __future__ import annotations

import enum


class ApiKey(enum.IntEnum):
    PRODUCE = 0
    FETCH = 1
    LIST_OFFSETS = 2
    METADATA = 3
    OFFSET_COMMIT = 8
    OFFSET_FETCH = 9
    FIND_COORDINATOR = 10
    JOIN_GROUP = 11
    HEARTBEAT = 12
    LEAVE_GROUP = 13
    SYNC_GROUP = 14
    DESCRIBE_GROUPS = 15
    LIST_GROUPS = 16
    API_VERSIONS = 18
    CREATE_TOPICS = 19
    INIT_PRODUCER_ID = 22
    ADD_PARTITIONS_TO_TXN = 24
    ADD_OFFSETS_TO_TXN = 25
    END_TXN = 26
    WRITE_TXN_MARKERS = 27
    TXN_OFFSET_COMMIT = 28
    DELETE_GROUPS = 42
    DESCRIBE_TRANSACTIONS = 65
    LIST_TRANSACTIONS = 66
    DELETE_TOPICS = 20
    DESCRIBE_CONFIGS = 32
    ALTER_CONFIGS = 33
    CREATE_PARTITIONS = 37
    INCREMENTAL_ALTER_CONFIGS = 44
    DESCRIBE_CLUSTER = 60
    DESCRIBE_PRODUCERS = 61
    SASL_HANDSHAKE = 17
    SASL_AUTHENTICATE = 36
    DESCRIBE_ACLS = 29
    CREATE_ACLS = 30
    DELETE_ACLS = 31


#: api key -> (min, max) as advertised in ApiVersions.
ADVERTISED: dict[ApiKey, tuple[int, int]] = {
    ApiKey.PRODUCE: (0, 7),
    ApiKey.FETCH: (4, 11),
    ApiKey.LIST_OFFSETS: (1, 3),
    ApiKey.METADATA: (0, 8),
    ApiKey.OFFSET_COMMIT: (0, 3),
    ApiKey.OFFSET_FETCH: (1, 7),
    ApiKey.FIND_COORDINATOR: (0, 2),
    ApiKey.JOIN_GROUP: (0, 5),
    ApiKey.HEARTBEAT: (0, 3),
    ApiKey.LEAVE_GROUP: (0, 1),
    ApiKey.SYNC_GROUP: (0, 3),
    ApiKey.API_VERSIONS: (0, 3),
    ApiKey.CREATE_TOPICS: (2, 4),
    ApiKey.INIT_PRODUCER_ID: (0, 4),
    ApiKey.ADD_PARTITIONS_TO_TXN: (0, 2),
    ApiKey.ADD_OFFSETS_TO_TXN: (0, 2),
    ApiKey.END_TXN: (0, 2),
    ApiKey.WRITE_TXN_MARKERS: (1, 1),
    ApiKey.TXN_OFFSET_COMMIT: (0, 2),
    ApiKey.DESCRIBE_TRANSACTIONS: (0, 0),
    ApiKey.LIST_TRANSACTIONS: (0, 1),
    # The admin APIs (docs/kafka.md, "Admin APIs"): Apache Kafka 4's ranges, DeleteTopics up
    # to 5 (6 names topics by id, which this broker does not give them), DescribeConfigs from
    # 0 (Kafka 3.9's, for sarama 1.22).
    ApiKey.DELETE_TOPICS: (1, 5),
    ApiKey.DESCRIBE_CONFIGS: (0, 4),
    ApiKey.ALTER_CONFIGS: (0, 2),
    ApiKey.CREATE_PARTITIONS: (0, 3),
    ApiKey.INCREMENTAL_ALTER_CONFIGS: (0, 1),
    ApiKey.DESCRIBE_CLUSTER: (0, 2),
    ApiKey.DESCRIBE_PRODUCERS: (0, 0),
    ApiKey.DESCRIBE_GROUPS: (0, 5),
    ApiKey.LIST_GROUPS: (0, 5),
    ApiKey.DELETE_GROUPS: (0, 2),
    # Authentication (docs/security.md, "Kafka SASL"): Kafka 4's ranges.
    ApiKey.SASL_HANDSHAKE: (0, 1),
    ApiKey.SASL_AUTHENTICATE: (0, 2),
    # Kafka ACLs (docs/security.md, "Kafka ACLs"): Kafka 4's ranges and v0, without pattern
    # types (LITERAL), which Kafka 4 dropped and sarama 1.22 sends.
    ApiKey.DESCRIBE_ACLS: (0, 3),
    ApiKey.CREATE_ACLS: (0, 3),
    ApiKey.DELETE_ACLS: (0, 3),
}

#: api key -> (min, max) actually served; a request outside it closes the connection
#: (ApiVersions excepted: it is answered UNSUPPORTED_VERSION).
SERVED: dict[ApiKey, tuple[int, int]] = {**ADVERTISED, ApiKey.PRODUCE: (3, 7)}

#: api key -> the first flexible (compact, tagged) version; absent = none of the served ones.
FLEXIBLE_FROM: dict[ApiKey, int] = {
    ApiKey.METADATA: 9,
    ApiKey.API_VERSIONS: 3,
    ApiKey.CREATE_TOPICS: 5,
    ApiKey.PRODUCE: 9,
    ApiKey.FETCH: 12,
    ApiKey.LIST_OFFSETS: 6,
    ApiKey.FIND_COORDINATOR: 3,
    ApiKey.JOIN_GROUP: 6,
    ApiKey.SYNC_GROUP: 4,
    ApiKey.HEARTBEAT: 4,
    ApiKey.LEAVE_GROUP: 4,
    ApiKey.OFFSET_COMMIT: 8,
    ApiKey.OFFSET_FETCH: 6,
    ApiKey.INIT_PRODUCER_ID: 2,
    ApiKey.ADD_PARTITIONS_TO_TXN: 3,
    ApiKey.ADD_OFFSETS_TO_TXN: 3,
    ApiKey.END_TXN: 3,
    ApiKey.WRITE_TXN_MARKERS: 1,
    ApiKey.TXN_OFFSET_COMMIT: 3,
    ApiKey.DESCRIBE_TRANSACTIONS: 0,
    ApiKey.LIST_TRANSACTIONS: 0,
    ApiKey.DELETE_TOPICS: 4,
    ApiKey.DESCRIBE_CONFIGS: 4,
    ApiKey.ALTER_CONFIGS: 2,
    ApiKey.CREATE_PARTITIONS: 2,
    ApiKey.INCREMENTAL_ALTER_CONFIGS: 1,
    ApiKey.DESCRIBE_CLUSTER: 0,
    ApiKey.DESCRIBE_PRODUCERS: 0,
    ApiKey.DESCRIBE_GROUPS: 5,
    ApiKey.LIST_GROUPS: 3,
    ApiKey.DELETE_GROUPS: 2,
    ApiKey.SASL_AUTHENTICATE: 2,
    ApiKey.DESCRIBE_ACLS: 2,
    ApiKey.CREATE_ACLS: 2,
    ApiKey.DELETE_ACLS: 2,
}


def is_flexible(api_key: int, version: int) -> bool:
    first = FLEXIBLE_FROM.get(ApiKey(api_key))
    return first is not None and version >= first
