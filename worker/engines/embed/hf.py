"""The transformers embedding engine: the model's encoder, pooled and normalised as its
recipe says (:mod:`worker.engines.embed.recipe`), on the CPU or CUDA.

This is what sentence-transformers computes for such a model, without depending on it:
token states from the encoder, the mean over the attention mask (or the first token's
state), then L2 normalisation when the model has a ``Normalize`` module. The texts of a
batch are sorted by length and cut into chunks whose padded size stays within
``batching.max_batch_tokens``, so padding costs little.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from transformers import AutoModel
from transformers.utils import logging as hf_logging

from worker.engines.base import EngineOutOfMemory
from worker.engines.embed.base import EmbeddingEngine, Vector
from worker.engines.embed.recipe import Recipe, read_recipe
from worker.engines.hf.model import (
    configure_cpu_threads,
    load_tokenizer,
    resolve_device,
    resolve_dtype,
)
from worker.engines.models import locate_model
from worker.errors import ModelLoadError


def pool(states: torch.Tensor, mask: torch.Tensor, recipe: Recipe) -> torch.Tensor:
    """One vector per row of ``states`` (rows × tokens × hidden), as ``recipe`` says."""
    if recipe.pooling == "cls":
        pooled = states[:, 0]
    else:
        weights = mask.unsqueeze(-1).to(states.dtype)
        pooled = (states * weights).sum(dim=1) / weights.sum(dim=1).clamp(min=1e-9)
    pooled = pooled.float()
    return torch.nn.functional.normalize(pooled, p=2, dim=-1) if recipe.normalize else pooled


def chunks(lengths: Sequence[int], budget: int) -> list[list[int]]:
    """Indices of ``lengths`` grouped, longest first, so that each group's rows × longest
    length stays within ``budget`` (a single row always forms a group)."""
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    groups: list[list[int]] = []
    for i in order:
        if groups and (len(groups[-1]) + 1) * lengths[groups[-1][0]] <= budget:
            groups[-1].append(i)
        else:
            groups.append([i])
    return groups


class HFEmbedEngine(EmbeddingEngine):
    """transformers ``AutoModel`` serving ``engine.model`` as an embedding model."""

    _model: Any = None
    device = torch.device("cpu")

    def load(self) -> None:
        self.device = resolve_device(self._config.device)
        dtype = resolve_dtype(self._config.dtype, self.device)
        if self.device.type == "cpu":
            configure_cpu_threads()
        source = locate_model(self._config.model)
        if source.gguf_file:
            raise ModelLoadError(f"{source} is a GGUF file: an embedding model is a directory")
        hf_logging.disable_progress_bar()  # type: ignore[no-untyped-call]
        recipe = read_recipe(source.directory)
        tokenizer = load_tokenizer(source)
        try:
            model = AutoModel.from_pretrained(str(source.directory), local_files_only=True)
            self._model = model.to(device=self.device, dtype=dtype).eval()
        except Exception as exc:
            raise ModelLoadError(f"cannot load embedding model {source}: {exc}") from exc
        self._pad = int(tokenizer.pad_token_id or 0)
        self.recipe, self.tokenizer = recipe, tokenizer

    def embed(self, sequences: Sequence[tuple[int, ...]]) -> list[Vector]:
        recipe, _ = self._loaded()
        vectors: list[Vector] = [()] * len(sequences)
        budget = self._batching.max_batch_tokens
        try:
            for group in chunks([len(s) for s in sequences], budget):
                rows = [sequences[i] for i in group]
                for i, vector in zip(group, self._forward(rows, recipe), strict=True):
                    vectors[i] = vector
        except torch.cuda.OutOfMemoryError as exc:
            torch.cuda.empty_cache()
            raise EngineOutOfMemory(str(exc)) from exc
        return vectors

    def _forward(self, rows: Sequence[tuple[int, ...]], recipe: Recipe) -> list[Vector]:
        width = max(len(row) for row in rows)
        ids = torch.full((len(rows), width), self._pad, dtype=torch.long)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        for r, row in enumerate(rows):  # right-padded: absolute positions start at 0
            ids[r, : len(row)] = torch.tensor(row, dtype=torch.long)
            mask[r, : len(row)] = 1
        ids, mask = ids.to(self.device), mask.to(self.device)
        with torch.inference_mode():
            states = self._model(input_ids=ids, attention_mask=mask).last_hidden_state
            pooled = pool(states, mask, recipe)
        return [tuple(row) for row in pooled.cpu().tolist()]

    def close(self) -> None:
        self._model = None
        if self.device.type == "cuda":
            torch.cuda.empty_cache()
