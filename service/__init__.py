"""jointspace.service — the HTTP front: FastAPI app, dynamic batcher, schemas; also the CLI entry point."""
from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("jointspace")
except PackageNotFoundError:  # a source checkout that was never installed
    __version__ = "0.0.0+source"
