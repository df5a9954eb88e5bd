"""batchpipe's tests: unit (no I/O), integration (embedded broker), e2e (the CLI), deploy."""

from pathlib import Path

#: the repository's root folder
ROOT = Path(__file__).resolve().parent.parent
