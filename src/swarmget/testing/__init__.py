"""A scripted HTTP/1.1 test server, for our tests, the demo and the benchmarks.

``/files/<name>?size=N&...`` serves deterministic content (``expected_body``)
with behaviour spelled in the query (see :mod:`swarmget.testing.files` and
:mod:`swarmget.testing.faults`); ``route()`` scripts arbitrary bytes
(:mod:`swarmget.testing.script`); ``GET /_stats`` returns the counters as JSON
(``?reset=1`` also zeroes them) without counting itself.

    with TestServer() as srv:                 # asyncio on a background thread
        srv.file_url("a.jpg", size=100, fault="truncate")
    with serve_in_subprocess() as srv:        # same server, own process
        srv.url("/files/a.jpg?size=100")
"""

from swarmget.testing.content import DEFAULT_SIZE, LAST_MODIFIED, etag, expected_body
from swarmget.testing.faults import FAULTS
from swarmget.testing.process import ProcessServer, serve_in_subprocess
from swarmget.testing.script import ScriptedConnection
from swarmget.testing.server import TestServer
from swarmget.testing.state import RouteHandler, ServerStats

__all__ = [
    "DEFAULT_SIZE",
    "FAULTS",
    "LAST_MODIFIED",
    "ProcessServer",
    "RouteHandler",
    "ScriptedConnection",
    "ServerStats",
    "TestServer",
    "etag",
    "expected_body",
    "serve_in_subprocess",
]
