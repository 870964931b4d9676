"""The Kafka wire protocol, sans-IO: framing and request/response messages of the versions
txbroker advertises, RecordBatch v2 and its compression codecs (docs/kafka.md)."""
