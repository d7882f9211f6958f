"""Sans-I/O HTTP/1.1 for a downloading client: bytes in, response events out.

Nothing here touches sockets, clocks or files, so every rule can be tested by
feeding bytes (see ``tests/test_protocol.py``).
"""

from swarmget.protocol.http11 import (
    MAX_HEADER_BYTES,
    MAX_HEADER_FIELDS,
    MAX_INFORMATIONAL,
    ConnectionClosed,
    ConnectResponseParser,
    ResponseHead,
    ResponseParser,
    build_request,
)

__all__ = [
    "MAX_HEADER_BYTES",
    "MAX_HEADER_FIELDS",
    "MAX_INFORMATIONAL",
    "ConnectResponseParser",
    "ConnectionClosed",
    "ResponseHead",
    "ResponseParser",
    "build_request",
]
