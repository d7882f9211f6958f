"""Rendering GET requests: one template per origin, filled in per request.

Everything after the request target is the same for every request to an
origin (Host, User-Agent, Accept, the user's headers), so it is encoded once,
in :class:`RequestTemplate`, and a plain request is two concatenations.  What
varies per request goes in front of the final blank line:

* ``Range`` (and ``If-Range``, so a continued part is only continued if the
  entity is unchanged) for a transfer of a byte range;
* credentials: the user's ``Authorization``/``Cookie`` headers and a URL's
  ``user:password@``, sent only to the origin they were meant for (and so is
  a ``Host`` header of the user's, in place of ours);
* ``Proxy-Authorization`` for an http proxy that forwards our requests
  (fixed per origin, so it is part of the tail).

An empty value is a header not sent at all: ``--header "User-Agent:"``
takes one of ours away, as curl's ``-H "Name:"`` does.  (A blank one, ``" "``,
is sent: a field whose value is empty, RFC 9110 5.5.)

The target was made safe by the caller (``engine/urls.py``): printable ASCII,
no spaces, so it can never end the request line early or inject a header.
"""

from __future__ import annotations

from collections.abc import Mapping


class RequestTemplate:
    __slots__ = ("_tail", "_tail_open", "closes", "host_omitted", "own_host", "target_prefix")

    def __init__(
        self,
        host_header: str,
        headers: Mapping[str, str],
        *,
        target_prefix: str = "",
        proxy_authorization: str | None = None,
        omit_host: bool = False,
    ) -> None:
        # omit_host: the user gave a Host header of their own.  It goes with the
        # credentials (to a job's first origin only, as curl sends it); a
        # request that a redirect took elsewhere sends ``own_host`` instead.
        self.own_host = f"Host: {host_header}\r\n".encode("latin-1")
        self.host_omitted = omit_host
        lines = [" HTTP/1.1"] if omit_host else [" HTTP/1.1", f"Host: {host_header}"]
        lines.extend(f"{name}: {value}" for name, value in headers.items() if value)
        if proxy_authorization is not None:
            lines.append(f"Proxy-Authorization: {proxy_authorization}")
        tail = ("\r\n".join(lines) + "\r\n").encode("latin-1")
        self._tail = tail + b"\r\n"
        self._tail_open = tail  # without the blank line: more headers follow
        # "http://host:port" for an http proxy (absolute-form, RFC 9112 3.2.2), else "".
        self.target_prefix = target_prefix
        # The user's "Connection: close": one request per connection (RFC 9112
        # 9.6: a client that sent close sends no further request on it).
        self.closes = any(
            name.lower() == "connection" and "close" in value.lower().replace(" ", "").split(",")
            for name, value in headers.items()
        )

    def render(
        self,
        target: str,
        *,
        byte_range: str | None = None,
        validator: str | None = None,
        credentials: bytes = b"",
    ) -> bytes:
        """The request for ``target``; ``credentials`` are whole CRLF-ended header lines."""
        line = b"GET " + (self.target_prefix + target).encode("ascii")
        if byte_range is None and not credentials:
            return line + self._tail
        extra = credentials
        if byte_range is not None:
            extra += f"Range: {byte_range}\r\n".encode("latin-1")
            if validator is not None:
                extra += f"If-Range: {validator}\r\n".encode("latin-1")
        return line + self._tail_open + extra + b"\r\n"


def header_lines(headers: Mapping[str, str]) -> bytes:
    """``Name: value`` CRLF-ended lines, for :meth:`RequestTemplate.render`'s credentials
    (none for an empty value: a header the user took away)."""
    lines = "".join(f"{name}: {value}\r\n" for name, value in headers.items() if value)
    return lines.encode("latin-1")
