"""The RocketMQ 5.x gRPC endpoint (``apache.rocketmq.v2.MessagingService``, docs/grpc.md):
5.x clients served by the broker itself, on the same store, topics and transactions, with no
proxy in between."""
