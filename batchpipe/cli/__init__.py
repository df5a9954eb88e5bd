"""The ``batchpipe`` command line (docs/architecture.md §6).

Every command reads the same configuration as the worker — built-in defaults, a YAML
file (``-c``), ``BATCHPIPE_*`` environment variables, ``--set key=value`` — so
``submit``, ``status`` and ``collect`` find the broker and topics exactly as the worker
does. ``submit``, ``status`` and ``collect`` are thin wrappers over
:class:`batchpipe.Client`.

Exit codes: 0 success, 1 a Kafka failure or unknown batch, 2 a bad command line,
configuration or batch file (nothing was published), 3 the worker's model failed to
load, 4 the worker wedged, 124 ``collect`` timed out, 130 interrupted.

The parser and :func:`main` are in :mod:`~batchpipe.cli.parser`; each command is in the
module of its kind: :mod:`~batchpipe.cli.processes` (broker, worker, serve, demo),
:mod:`~batchpipe.cli.submit` (submit, run), :mod:`~batchpipe.cli.results` (collect,
status, list), :mod:`~batchpipe.cli.retry`.
"""

from batchpipe.cli.options import duration
from batchpipe.cli.outcome import EXIT_USAGE
from batchpipe.cli.parser import main
from batchpipe.cli.results import format_status

__all__ = ["EXIT_USAGE", "duration", "format_status", "main"]
