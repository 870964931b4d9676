"""Storage: memory-mapped commitlog, consume queues, flush, consumer offsets, recovery."""
