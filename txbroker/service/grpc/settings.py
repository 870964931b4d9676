"""The settings the broker answers a 5.x client's Telemetry ``Settings`` with.

The client sends what it is; the broker echoes it with the parts it decides merged in, as the
apache/rocketmq proxy's ``GrpcClientSettingsManager`` does.  Clients depend on them:

* a producer must get ``backoff_policy.exponential_backoff`` (the Java client throws "strategy
  must be exponential backoff" otherwise) and a non-zero ``publishing.max_body_size`` (the
  clients copy it verbatim; the Python client refuses any larger body);
* a consumer gets how often a failed message is retried (``backoff_policy``, max attempts =
  the group's max reconsume times + 1, the broker's retry delays), its long-polling time and
  batch size, and whether its group is FIFO.

The answer carries ``status OK``: the Python client ignores a settings command without it.
"""

from __future__ import annotations

from google.protobuf.duration_pb2 import Duration

from txbroker.config import BrokerConfig
from txbroker.remoting.grpc import definition_pb2 as pb

#: A producer's retries of a failed send (the proxy's defaults: 10 ms doubling to 1 s).
PRODUCER_BACKOFF_INITIAL_MS = 10
PRODUCER_BACKOFF_MAX_MS = 1000
PRODUCER_BACKOFF_MULTIPLIER = 2.0
PRODUCER_MAX_ATTEMPTS = 3
#: A consumer's wait between deliveries of a message it failed: RocketMQ's retry delays
#: (delay levels 3..18 of ``messageDelayLevel``), as the proxy hands them out.
CONSUMER_RETRY_DELAYS_S = (10, 30, 60, 120, 180, 240, 300, 360, 420, 480, 540, 600, 1200, 1800,
                           3600, 7200)
#: A consumer's long-polling time (the proxy's ``grpcClientConsumerLongPollingTimeoutMillis``)
#: and batch size when it sets none.
CONSUMER_LONG_POLLING_S = 20
CONSUMER_BATCH_SIZE = 32


def _ms(ms: int) -> Duration:
    return Duration(seconds=ms // 1000, nanos=(ms % 1000) * 1_000_000)


def max_body_size(config: BrokerConfig) -> int:
    return config.grpc_max_body_size or config.max_message_size


def answer(config: BrokerConfig, sent: pb.Settings, *, fifo: bool = False) -> pb.Settings:
    """The client's settings with the broker's decisions merged in (``fifo``: the consumer
    group delivers in order)."""
    out = pb.Settings()
    out.CopyFrom(sent)
    out.metric.CopyFrom(pb.Metric(on=False))
    if sent.HasField("publishing") or sent.client_type == pb.PRODUCER:
        out.backoff_policy.CopyFrom(pb.RetryPolicy(
            max_attempts=PRODUCER_MAX_ATTEMPTS,
            exponential_backoff=pb.ExponentialBackoff(
                initial=_ms(PRODUCER_BACKOFF_INITIAL_MS), max=_ms(PRODUCER_BACKOFF_MAX_MS),
                multiplier=PRODUCER_BACKOFF_MULTIPLIER)))
        out.publishing.max_body_size = max_body_size(config)
        out.publishing.validate_message_type = True
    elif sent.HasField("subscription"):
        out.backoff_policy.CopyFrom(pb.RetryPolicy(
            max_attempts=config.max_reconsume_times + 1,
            customized_backoff=pb.CustomizedBackoff(
                next=[_ms(s * 1000) for s in CONSUMER_RETRY_DELAYS_S])))
        sub = out.subscription
        sub.fifo = fifo
        if not sent.subscription.HasField("receive_batch_size"):
            sub.receive_batch_size = CONSUMER_BATCH_SIZE
        if not sent.subscription.HasField("long_polling_timeout"):
            sub.long_polling_timeout.CopyFrom(_ms(CONSUMER_LONG_POLLING_S * 1000))
    return out
