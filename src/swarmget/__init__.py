"""swarmget: download very many files over HTTP(S), fast, on a non-blocking event loop."""

from swarmget.errors import ErrorCode, SwarmgetError, TransferError, UsageError
from swarmget.manifest import manifest_frame, manifest_table, read_manifest
from swarmget.options import Options
from swarmget.report import FileResult, Report

__version__ = "0.1.0"


def download(urls, dest, **options):  # type: ignore[no-untyped-def]
    """Download ``urls`` into directory ``dest``; see :func:`swarmget.api.download`."""
    from swarmget.api import download as _download

    return _download(urls, dest, **options)


def stream(urls, **options):  # type: ignore[no-untyped-def]
    """Every URL's bytes inside your loop; see :func:`swarmget.streaming.stream`."""
    from swarmget.streaming import stream as _stream

    return _stream(urls, **options)


def astream(urls, **options):  # type: ignore[no-untyped-def]
    """:func:`stream` as an async iterator; see :func:`swarmget.streaming.astream`."""
    from swarmget.streaming import astream as _astream

    return _astream(urls, **options)


def compiled() -> bool:
    """True when the hot path runs as C compiled by mypyc (see setup.py), False
    when it runs from the ``.py`` files (``SWARMGET_PURE_PYTHON=1``, no C compiler,
    or a checkout's ``src`` on the path)."""
    from swarmget.engine import connection

    return not connection.__file__.endswith(".py")


__all__ = [
    "ErrorCode",
    "FileResult",
    "Options",
    "Report",
    "SwarmgetError",
    "TransferError",
    "UsageError",
    "__version__",
    "astream",
    "compiled",
    "download",
    "manifest_frame",
    "manifest_table",
    "read_manifest",
    "stream",
]
