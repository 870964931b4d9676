"""txbroker: a transactional message broker on asyncio, wire-compatible with RocketMQ 4.x."""

__version__ = "0.1.0"
