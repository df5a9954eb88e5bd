"""Fair share on a shared fleet: the feeder that moves batches from the pending topic into
the requests topic a slice at a time (docs/architecture.md §10)."""
