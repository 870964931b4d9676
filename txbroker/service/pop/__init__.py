"""POP consumption (RocketMQ 5's receive / ack by receipt handle) and FIFO receives on the
store's topics: :class:`PopService` (:mod:`.service`), its state records (:mod:`.state`),
their log in the commitlog (:mod:`.log`) and receipt handles (:mod:`.handles`)."""

from txbroker.service.pop.service import Popped, PopService
from txbroker.service.pop.state import PopError, PopErrorKind

__all__ = ["PopError", "PopErrorKind", "PopService", "Popped"]
