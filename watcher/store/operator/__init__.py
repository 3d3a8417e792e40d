"""The store's parts for operator verbs that span a partition's items (rewind); the older
verbs (retry, set-gate, cancel) are :mod:`watcher.store.operations`."""
