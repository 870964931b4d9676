"""Where the topics and partitions sit in the Kafka requests that name them, and in their
answers: one description per API, read by every step that takes a request apart by partition
(authorization refuses topics, cluster routing translates partition numbers and refuses those
led elsewhere, a coordinator refuses a request as a whole).

Field names are Kafka's own (clients/src/main/resources/common/message/*.json); a partition
refused before its handler saw it is answered with its index, the error code and the
``refused`` defaults of the API's partition answer, so a client reads a whole entry.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from txbroker.remoting.kafka.apis import ApiKey


@dataclass(frozen=True, slots=True)
class Shape:
    """One API's request and answer, by partition.  ``req_index`` None: the request lists its
    partitions as bare numbers (OffsetFetch's ``partition_indexes``)."""

    req_topics: str
    req_name: str
    req_parts: str
    req_index: str | None
    resp_topics: str
    resp_name: str
    resp_parts: str
    resp_index: str
    resp_error: str = "error_code"
    #: A refused partition's answer besides its index and error code.
    refused: tuple[tuple[str, Any], ...] = ()

    def indexes(self, topic: dict) -> list[int]:
        """The partition numbers one request topic names."""
        items = topic.get(self.req_parts) or ()
        return list(items) if self.req_index is None else [p[self.req_index] for p in items]

    def index_of(self, item: Any) -> int:
        """The partition number of one request partition entry."""
        return item if self.req_index is None else item[self.req_index]

    def renumbered(self, item: Any, index: int) -> Any:
        """One request partition entry, naming partition ``index`` instead."""
        return index if self.req_index is None else {**item, self.req_index: index}

    def refused_partition(self, index: int, code: int) -> dict:
        """The answer of one partition refused with ``code``."""
        return {self.resp_index: index, self.resp_error: int(code), **dict(self.refused)}

    def refused_topics(self, topics: Iterable[dict], code: int) -> list[dict]:
        """The answers of request topics ``topics``, every partition refused with ``code``."""
        return [{self.resp_name: t[self.req_name],
                 self.resp_parts: [self.refused_partition(i, code) for i in self.indexes(t)]}
                for t in topics]

    def refuse_all(self, body: dict, code: int, **top: Any) -> dict:
        """The answer refusing every partition of the request with ``code`` (``top``: the
        answer's other top-level fields)."""
        return {**top, self.resp_topics: self.refused_topics(body.get(self.req_topics) or (),
                                                             code)}


SHAPES: dict[ApiKey, Shape] = {
    ApiKey.PRODUCE: Shape("topic_data", "name", "partition_data", "index",
                          "responses", "name", "partition_responses", "index",
                          refused=(("base_offset", -1), ("log_append_time_ms", -1),
                                   ("log_start_offset", -1))),
    ApiKey.FETCH: Shape("topics", "topic", "partitions", "partition",
                        "responses", "topic", "partitions", "partition_index",
                        refused=(("high_watermark", -1), ("last_stable_offset", -1),
                                 ("log_start_offset", -1), ("preferred_read_replica", -1),
                                 ("records", b""))),
    ApiKey.LIST_OFFSETS: Shape("topics", "name", "partitions", "partition_index",
                               "topics", "name", "partitions", "partition_index",
                               refused=(("timestamp", -1), ("offset", -1))),
    ApiKey.OFFSET_COMMIT: Shape("topics", "name", "partitions", "partition_index",
                                "topics", "name", "partitions", "partition_index"),
    ApiKey.TXN_OFFSET_COMMIT: Shape("topics", "name", "partitions", "partition_index",
                                    "topics", "name", "partitions", "partition_index"),
    ApiKey.OFFSET_FETCH: Shape("topics", "name", "partition_indexes", None,
                               "topics", "name", "partitions", "partition_index",
                               refused=(("committed_offset", -1), ("metadata", ""))),
    ApiKey.ADD_PARTITIONS_TO_TXN: Shape("topics", "name", "partitions", None,
                                        "results", "name", "results", "partition_index",
                                        "partition_error_code"),
    ApiKey.DESCRIBE_PRODUCERS: Shape("topics", "name", "partition_indexes", None,
                                     "topics", "name", "partitions", "partition_index"),
}
