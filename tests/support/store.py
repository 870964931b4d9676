"""A small MessageStore on real files, for the store tests (segments of 64 KiB roll over soon)."""

from __future__ import annotations

from pathlib import Path

from txbroker.config import BrokerConfig
from txbroker.store.message_store import MessageStore

#: Segment size of :func:`store_config` stores.
SEG = 64 * 1024


def store_config(tmp_path: Path, **kw) -> BrokerConfig:
    base = {"data_dir": str(tmp_path / "data"), "segment_size": SEG, "max_message_size": 8192,
            "consume_queue_entries": 64, "flush_interval": 0.05}
    base.update(kw)
    return BrokerConfig(**base)


async def opened(config: BrokerConfig, **kw) -> MessageStore:
    """A store opened and started (its flusher running)."""
    store = MessageStore(config, **kw)
    store.open()
    await store.start()
    return store
