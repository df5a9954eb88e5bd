"""Generated protobuf code of the wire contract (``proto/batchpipe/v1``).

Nothing but :mod:`worker.codec` imports from here: the rest of batchpipe works with the
domain objects of :mod:`worker.messages`. Regenerate with ``make proto``.
"""
