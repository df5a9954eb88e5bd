"""The worker loop: poll → decode → admit → batch → run → publish → commit
(docs/architecture.md §2), with the jobs it carries and the ledger that says which offsets
may be committed."""
