"""How a transaction ended: what the publishers report to their ``on_outcome`` callback and
the label of ``batchpipe_transactions_total`` (:mod:`worker.obs.metrics`)."""

from __future__ import annotations

from typing import Literal

TxOutcome = Literal["commit", "abort"]
