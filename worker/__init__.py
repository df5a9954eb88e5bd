"""The batchpipe worker service: Kafka I/O, codec, engines, metrics, configuration."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("batchpipe")
except PackageNotFoundError:  # running from a source tree without installing
    __version__ = "0.0.0"
