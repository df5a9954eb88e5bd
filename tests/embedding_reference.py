"""all-MiniLM-L6-v2's own embeddings, computed the way sentence-transformers does for this
model (token states, mean over the attention mask, L2 normalisation) with plain
transformers: the reference the embedding engines are checked against, written apart from
their code."""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from transformers import AutoModel, AutoTokenizer

from worker.engines.models import locate_model
from worker.known_models import EMBEDDING_MODEL


def reference_vectors(texts: Sequence[str]) -> list[list[float]]:
    directory = str(locate_model(EMBEDDING_MODEL).directory)
    tokenizer = AutoTokenizer.from_pretrained(directory, local_files_only=True)
    model = AutoModel.from_pretrained(directory, local_files_only=True).eval()
    batch = tokenizer(
        list(texts), padding=True, truncation=True, max_length=256, return_tensors="pt"
    )
    with torch.no_grad():
        states = model(**batch).last_hidden_state
    mask = batch["attention_mask"].unsqueeze(-1).float()
    mean = (states * mask).sum(dim=1) / mask.sum(dim=1)
    vectors: list[list[float]] = torch.nn.functional.normalize(mean, dim=-1).tolist()
    return vectors


def cosine(a: Sequence[float], b: Sequence[float]) -> float:
    dot = sum(x * y for x, y in zip(a, b, strict=True))
    return dot / (math.sqrt(sum(x * x for x in a)) * math.sqrt(sum(y * y for y in b)))
