"""swarmget: download very many files over HTTP(S), fast, on a non-blocking event loop.

The names below load when first used (PEP 562): ``import swarmget`` stays cheap
(DataLoader workers and ``python -m swarmget`` import it first), and a Ctrl-C
in the script's first milliseconds reaches ``__main__.run``'s handler instead
of interrupting a chain of imports with a traceback.
"""

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (14 ms)
if TYPE_CHECKING:  # what static tools and IDEs see; at run time, __getattr__
    from swarmget.errors import ErrorCode, SwarmgetError, TransferError, UsageError
    from swarmget.manifest import manifest_frame, manifest_table, read_manifest
    from swarmget.options import Options
    from swarmget.report import FileResult, Report

__version__ = "0.1.0"

# Each public name and the module that defines it.
_LAZY = {
    "ErrorCode": "swarmget.errors",
    "SwarmgetError": "swarmget.errors",
    "TransferError": "swarmget.errors",
    "UsageError": "swarmget.errors",
    "manifest_frame": "swarmget.manifest",
    "manifest_table": "swarmget.manifest",
    "read_manifest": "swarmget.manifest",
    "Options": "swarmget.options",
    "FileResult": "swarmget.report",
    "Report": "swarmget.report",
}


def __getattr__(name: str) -> object:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'swarmget' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # once: later lookups do not come here
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


def download(urls, dest, **options):  # type: ignore[no-untyped-def]
    """Download ``urls`` into directory ``dest``; see :func:`swarmget.api.download`."""
    from swarmget.api import download as _download

    return _download(urls, dest, **options)


def stream(urls=None, **options):  # type: ignore[no-untyped-def]
    """Every URL's bytes inside your loop; see :func:`swarmget.streaming.stream`."""
    from swarmget.streaming import stream as _stream

    return _stream(urls, **options)


def astream(urls=None, **options):  # type: ignore[no-untyped-def]
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
