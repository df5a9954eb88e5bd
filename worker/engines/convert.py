"""A GGUF model as a Hugging Face model directory, converted once into a cache folder.

vLLM loads Hugging Face directories; the default model ships as a GGUF file
(:mod:`worker.engines.models`). transformers reads GGUF (dequantising it), but cannot
``save_pretrained`` the model it loaded that way: the loaded model carries the GGUF
quantization config, which saving refuses. A model built ``from_config`` (the same
architecture, no ``quantization_config``) that takes the loaded weights with
``load_state_dict`` saves normally, so that is what :func:`hf_directory` writes.

The directory is named after the GGUF file, its size and modification time, so a changed
file converts again, and it is written atomically: into a temporary directory beside the
target, renamed into place when complete. Two workers converting at once both succeed;
the second rename loses and its copy is discarded. Weights are saved in float32: the
dequantised GGUF values are not all representable in 16 bits.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from pathlib import Path

from worker.engines.models import ModelSource
from worker.errors import ModelLoadError

log = logging.getLogger(__name__)


def hf_directory(source: ModelSource, cache_dir: str) -> Path:
    """A Hugging Face model directory for ``source``: its own directory when it is one,
    else the GGUF file converted under ``cache_dir`` (on the first call only)."""
    if source.gguf_file is None:
        return source.directory
    gguf = source.directory / source.gguf_file
    try:
        stat = gguf.stat()
        root = Path(cache_dir).expanduser()
        root.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ModelLoadError(f"cannot convert {gguf} under {cache_dir}: {exc}") from exc
    target = root / f"{gguf.stem}-{stat.st_size}-{stat.st_mtime_ns}"
    if (target / "config.json").is_file():
        return target
    log.info("converting %s into a Hugging Face directory at %s (once)", gguf, target)
    scratch = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=root))
    try:
        _convert(source, scratch)
        os.rename(scratch, target)
    except OSError:
        if not (target / "config.json").is_file():
            raise
        # another process finished the same conversion first: keep its copy
    except Exception as exc:
        raise ModelLoadError(f"cannot convert {gguf} to a Hugging Face directory: {exc}") from exc
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return target


def _convert(source: ModelSource, out: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # type: ignore[no-untyped-call]
    gguf = {"gguf_file": source.gguf_file}
    directory = str(source.directory)
    tokenizer = AutoTokenizer.from_pretrained(directory, local_files_only=True, **gguf)
    loaded = AutoModelForCausalLM.from_pretrained(
        directory, local_files_only=True, dtype=torch.float32, **gguf
    )
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)  # type: ignore[no-untyped-call]
    model.load_state_dict(loaded.state_dict())
    model.generation_config = loaded.generation_config
    model.save_pretrained(str(out))
    tokenizer.save_pretrained(str(out))
