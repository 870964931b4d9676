"""The manual clock the tests share with the check-pass bench (``txbroker.bench.clock``)."""

from txbroker.bench.clock import ManualClock

__all__ = ["ManualClock"]
