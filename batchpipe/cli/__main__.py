"""``python -m batchpipe.cli``: the ``batchpipe`` command."""

import sys

from batchpipe.cli.parser import main

sys.exit(main())
