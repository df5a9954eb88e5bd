"""Inference engines behind one contract (:mod:`worker.engines.base`)."""
