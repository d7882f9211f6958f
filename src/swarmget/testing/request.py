"""Just enough request parsing for a test server.

The server only has to understand well-behaved clients (our own engine, curl,
``http.client``), so this is a split on CRLF rather than a full parser; the
strictness lives in the client, which is what the server exists to test.
Anything it cannot make sense of is answered with 400 and a close.
"""

from __future__ import annotations

from dataclasses import dataclass

MAX_HEAD = 1 << 20


class BadRequest(Exception):
    """The request head could not be parsed; the connection answers 400 and closes."""


@dataclass(slots=True)
class Request:
    method: str
    target: str
    path: str
    query: str
    version: str
    headers: dict[str, str]  # names lower-cased; a repeated name keeps the last value
    head: bytes  # the raw head, without the blank line that ends it

    @property
    def keep_alive(self) -> bool:
        tokens = {t.strip().lower() for t in self.headers.get("connection", "").split(",")}
        if self.version == "HTTP/1.0":
            return "keep-alive" in tokens
        return "close" not in tokens

    @property
    def body_length(self) -> int:
        """Bytes of request body to skip before the next request."""
        if "transfer-encoding" in self.headers:
            raise BadRequest("chunked request bodies are not supported")
        value = self.headers.get("content-length", "0")
        if not value.isdigit():
            raise BadRequest(f"bad Content-Length {value!r}")
        return int(value)


def parse_head(head: bytes) -> Request:
    """Parse a request head (everything before the first blank line)."""
    text = head.decode("latin-1")
    lines = text.split("\r\n")
    parts = lines[0].split(" ")
    if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
        raise BadRequest(f"bad request line {lines[0][:100]!r}")
    method, target, version = parts
    headers: dict[str, str] = {}
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if not sep or not name or name != name.strip():
            raise BadRequest(f"bad header line {line[:100]!r}")
        headers[name.lower()] = value.strip()
    path, _, query = target.partition("?")
    return Request(method, target, path, query, version, headers, head)
