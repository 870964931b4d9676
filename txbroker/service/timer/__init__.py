"""Timer messages (RocketMQ 5's ``TIMER_DELIVER_MS`` / ``TIMER_DELAY_SEC`` / ``TIMER_DELAY_MS``),
recall, and transactional timers: :mod:`.props` (the wire and record format, pure),
:mod:`.index` (the pending timers in memory, pure), :mod:`.service` (the store I/O and the
delivery loop).  docs/grpc.md, "Timer messages", says what is served and how it differs from
RocketMQ."""

from txbroker.service.timer.props import TimerRefusal
from txbroker.service.timer.service import TimerService

__all__ = ["TimerRefusal", "TimerService"]
