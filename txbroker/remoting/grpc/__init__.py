"""RocketMQ 5's gRPC protocol (``apache.rocketmq.v2``): the generated protobuf messages and
service stubs, committed (:mod:`txbroker.remoting.grpc.regenerate` says how they are made)."""
