"""OpenSSL settings Python's ``ssl`` module does not expose, set through ctypes.

Read-ahead
----------
Without it OpenSSL reads a TLS record in two ``read()`` calls, its 5-byte
header and then its body, so a 50 KB response costs about eight system calls
(``bench/profile_https.py wrap``: 8.6 reads per file, against libcurl's 1.3).
With ``SSL_CTX_set_read_ahead`` it reads whatever the kernel has, up to its
read buffer, and takes records out of that.  Measured on W4 in one process:
about 14% less client CPU per file, and 13% less wall time.

The price is that OpenSSL may now hold bytes the kernel no longer reports as
readable: whoever reads must go on until ``SSLWantReadError`` before waiting
for epoll again (``engine/https.py`` does; without read-ahead it may stop
early).  CPython asks OpenSSL to release a connection's buffers when they are
empty (``SSL_MODE_RELEASE_BUFFERS``), so an idle pooled connection holds none
and the larger read buffer costs memory only while a response is coming in.

How it is reached: the ``SSL_CTX`` pointer is the first field after the
object header of CPython's ``PySSLContext`` (so it has been since Python 3.2),
and the functions are looked up through the ``_ssl`` extension, which links
the very libssl that made the context.  Before anything is set, the context's
options read through that pointer must equal ``SSLContext.options``: any
doubt (another Python implementation, a statically linked ``_ssl``, Windows,
a libssl without the functions) and the context is left as it was, which is
still correct, only slower.  ``SWARMGET_NO_READ_AHEAD=1`` leaves it alone too.
"""

from __future__ import annotations

import os
import ssl
import sys
from typing import Final

READ_BUFFER: Final = 64 * 1024  # bytes OpenSSL may read at once (its default: one record)

_SSL_CTRL_SET_READ_AHEAD: Final = 41


def enable_read_ahead(context: ssl.SSLContext, buffer_bytes: int = READ_BUFFER) -> bool:
    """Turn on read-ahead for connections made from ``context`` from now on.
    True if it was done; False: left as it was."""
    if os.environ.get("SWARMGET_NO_READ_AHEAD") or not _supported():
        return False
    try:
        import _ssl
        import ctypes

        library = ctypes.CDLL(_ssl.__file__)
        ctrl = library.SSL_CTX_ctrl
        get_options = library.SSL_CTX_get_options
        set_buffer = library.SSL_CTX_set_default_read_buffer_len
    except (ImportError, OSError, AttributeError):  # no file, no such symbol
        return False
    ctrl.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_long, ctypes.c_void_p]
    ctrl.restype = ctypes.c_long
    get_options.argtypes = [ctypes.c_void_p]
    get_options.restype = ctypes.c_uint64
    set_buffer.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    set_buffer.restype = None
    pointer = ctypes.c_void_p.from_address(id(context) + object.__basicsize__).value
    if not pointer or get_options(pointer) != int(context.options):
        return False  # not the layout we know: leave it alone
    set_buffer(pointer, buffer_bytes)
    ctrl(pointer, _SSL_CTRL_SET_READ_AHEAD, 1, None)
    return True


def _supported() -> bool:
    """CPython on a POSIX system, with a context object of the layout we know."""
    if sys.implementation.name != "cpython" or sys.platform == "win32":
        return False
    size = ssl.SSLContext.__basicsize__
    return bool(size >= object.__basicsize__ + 8)
