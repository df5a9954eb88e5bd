"""Embedding engines (``engine.task: embed``): ``/v1/embeddings`` requests, no generation."""
