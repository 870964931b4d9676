"""A broker process that pops, acks and changes invisibility, prints its receipt handles as
one JSON line, then waits to be SIGKILLed: the crash side of the POP recovery test.

Run: python tests/support/pop_node.py DATA_DIR

Topic ``TKill`` queue 0 gets m0..m5, all popped (invisible 3 s), m0, m2, m4 acknowledged, m5
made invisible for a minute; FIFO topic ``TKillFifo`` gets f0, f1 and f0 is popped (invisible
a minute, so the queue stays locked).
"""

from __future__ import annotations

import asyncio
import sys

import orjson

from txbroker.broker import Broker
from txbroker.config import BrokerConfig
from txbroker.store.record import Message

GROUP = "GID_KILL"
SETTINGS = {"listen_host": "127.0.0.1", "broker_port": 0, "namesrv_port": 0,
            "metrics_port": -1, "segment_size": 1024 * 1024, "max_message_size": 256 * 1024,
            "consume_queue_entries": 4096, "flush_interval": 0.05,
            "offset_persist_interval": 0.2, "pop_min_invisible_ms": 100}


def config(data_dir: str) -> BrokerConfig:
    return BrokerConfig(data_dir=data_dir, **SETTINGS)


async def main(data_dir: str) -> None:
    broker = Broker(config(data_dir))
    await broker.start()
    pop = broker.pop
    handles: dict[str, str] = {}
    for topic, bodies in (("TKill", [f"m{i}" for i in range(6)]), ("TKillFifo", ["f0", "f1"])):
        await broker.topics.get_or_create(topic)
        for body in bodies:
            assert (await broker.store.put(Message(topic, 0, body.encode()))).ok
    for p in await pop.pop(GROUP, "TKill", queue_id=0, batch_size=6, invisible_ms=3000):
        handles[p.message.body.decode()] = p.handle
    for body in ("m0", "m2", "m4"):
        await pop.ack(GROUP, handles[body])
    handles["m5"] = (await pop.change_invisible(GROUP, handles["m5"], 60_000)).handle
    [f0] = await pop.pop(GROUP, "TKillFifo", queue_id=0, invisible_ms=60_000, fifo=True)
    handles["f0"] = f0.handle
    print(orjson.dumps(handles).decode(), flush=True)
    await asyncio.sleep(120)  # killed long before


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1]))
