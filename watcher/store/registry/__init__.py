"""The store's part for the registry of running processors: each processor's row (what it
serves, until when by the database clock) and the open partitions' places, which
together say where a partition waits for a processor that serves it."""
