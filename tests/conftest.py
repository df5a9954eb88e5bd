"""Settings for every test layer.

Hypothesis' per-example deadline measures wall time, which a loaded 2-core machine
stretches at random: the properties are about results, never about speed (no timing
assertions in tests), so no example has a deadline.
"""

from hypothesis import settings

settings.register_profile("batchpipe", deadline=None)
settings.load_profile("batchpipe")
