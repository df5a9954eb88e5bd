"""The one base of every exception batchpipe raises.

It lives in the lowest layer (:mod:`batcher` imports nothing of the project) so that every
package can derive from it; :mod:`worker.errors` and :mod:`batchpipe` re-export it. Each
project exception also keeps the builtin base it needs (``ValueError``, ``TimeoutError``,
…), so ``except ValueError`` around, say, a configuration load keeps working.
"""

from __future__ import annotations


class BatchpipeError(Exception):
    """Something batchpipe reports, as opposed to a bug or a library's own exception.

    ``code`` is the wire error code (4001…5003, :class:`worker.errors.ErrorCode`) where one
    applies, ``None`` otherwise.
    """

    code: int | None = None
