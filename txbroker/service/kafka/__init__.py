"""The Kafka-protocol listener's behaviour over the broker's store: produce and fetch, the group
coordinator and the transaction coordinator (docs/kafka.md).  The package's ``__init__``
imports nothing: import its modules."""
