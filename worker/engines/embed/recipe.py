"""How an embedding model turns token states into one vector: read from its directory.

A sentence-transformers model directory says it in its own files: ``modules.json`` (is
there a ``Normalize`` module), ``1_Pooling/config.json`` (mean or CLS pooling),
``sentence_bert_config.json`` (the most tokens it reads, whether it lower-cases), and
``config.json`` (``hidden_size``: the vector's size). A plain Hugging Face encoder
directory gets sentence-transformers' defaults: mean pooling, no normalisation, up to
``max_position_embeddings`` tokens. vLLM reads the same files for its pooler; the hf
engine applies the recipe itself.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from worker.errors import ModelLoadError

Pooling = Literal["mean", "cls"]
_POOLING_MODES: dict[str, Pooling] = {
    "pooling_mode_mean_tokens": "mean",
    "pooling_mode_cls_token": "cls",
}


@dataclass(frozen=True)
class Recipe:
    """Pooling, normalisation, input bound and vector size of one embedding model."""

    pooling: Pooling
    normalize: bool
    max_tokens: int
    dimension: int
    lower_case: bool = False

    def prepared(self, text: str) -> str:
        """``text`` as the model's tokenizer must see it."""
        return text.lower() if self.lower_case else text


def _json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"cannot read {path}: {exc}") from exc


def read_recipe(directory: Path) -> Recipe:
    """The recipe of the model in ``directory``; :class:`ModelLoadError` for one it cannot
    follow (a pooling mode other than mean or CLS)."""
    config = _json(directory / "config.json")
    modules = _json(directory / "modules.json") if (directory / "modules.json").is_file() else []
    kinds = {str(m.get("type", "")).rsplit(".", 1)[-1]: m for m in modules}
    pooling: Pooling = "mean"
    if "Pooling" in kinds:
        settings = _json(directory / kinds["Pooling"]["path"] / "config.json")
        modes = [mode for key, mode in _POOLING_MODES.items() if settings.get(key)]
        others = [k for k, on in settings.items() if k.startswith("pooling_mode") and on]
        if len(modes) != 1 or len(others) != 1:
            raise ModelLoadError(f"{directory}: only mean or CLS pooling is supported: {others}")
        pooling = modes[0]
    bound = int(config.get("max_position_embeddings", 512))
    st_path = directory / "sentence_bert_config.json"
    st = _json(st_path) if st_path.is_file() else {}
    return Recipe(
        pooling=pooling,
        normalize="Normalize" in kinds,
        max_tokens=min(bound, int(st.get("max_seq_length") or bound)),
        dimension=int(config["hidden_size"]),
        lower_case=bool(st.get("do_lower_case", False)),
    )
