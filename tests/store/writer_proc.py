"""A store writer run as a child process: appends until killed, reporting each acknowledged put.

The parent SIGKILLs it mid-append and then checks that every put this process reported as
stored survives recovery.  Run: python tests/store/writer_proc.py DATA_DIR MODE COUNT
"""

import asyncio
import sys

from txbroker.config import BrokerConfig
from txbroker.store.message_store import MessageStore
from txbroker.store.record import Message


async def main(data_dir: str, mode: str, count: int) -> None:
    cfg = BrokerConfig(data_dir=data_dir, segment_size=256 * 1024, max_message_size=8192,
                       consume_queue_entries=512, flush_mode=mode, flush_interval=0.05)
    store = MessageStore(cfg)
    store.open()
    await store.start()
    out = sys.stdout
    for i in range(count):
        body = (b"%08d" % i) * (1 + i % 50)
        r = await store.put(Message("Crash", i % 3, body, properties={"KEYS": str(i)}))
        out.write(f"{i} {r.status.name} {r.physical_offset}\n")
        out.flush()
    await store.close()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], int(sys.argv[3])))
