"""Starting a non-blocking TCP connect."""

from __future__ import annotations

import errno
import socket

from swarmget.net.address import Address

_IN_PROGRESS = frozenset({0, errno.EINPROGRESS, errno.EWOULDBLOCK, errno.EALREADY})


def start_connect(address: Address) -> tuple[socket.socket | None, int]:
    """Create a non-blocking socket and begin connecting.

    Returns the socket and an errno: 0 / EINPROGRESS mean "wait for writability";
    anything else is an immediate failure (the socket is already closed then, or
    None: there was none to make, ``EMFILE`` in a program near its limit).
    """
    family, sockaddr = address
    try:
        sock = socket.socket(family, socket.SOCK_STREAM)
    except OSError as exc:
        return None, exc.errno or errno.EIO
    try:
        sock.setblocking(False)
        # Requests are one small write each; Nagle would only delay them.
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        err = sock.connect_ex(sockaddr)
    except OSError as exc:
        sock.close()
        return sock, exc.errno or errno.EIO
    if err in _IN_PROGRESS:
        return sock, errno.EINPROGRESS
    sock.close()
    return sock, err


def connect_result(sock: socket.socket) -> int:
    """The outcome of a connect that finished (socket became writable): 0 or an errno."""
    return sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
