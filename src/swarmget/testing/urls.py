"""URL building shared by the in-thread and the subprocess server handles."""

from __future__ import annotations

from urllib.parse import quote, urlencode


class ServerUrls:
    """Mixin: ``base_url``, ``url()`` and ``file_url()`` from ``host`` and ``port``."""

    host: str
    port: int

    @property
    def base_url(self) -> str:
        """``http://127.0.0.1:<port>``, no trailing slash."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    def url(self, path: str = "/", **query: object) -> str:
        """Absolute URL for ``path`` (which may carry its own query) plus ``query``.

        ``srv.url("/files/a.jpg", size=100, fault="truncate")`` ==
        ``srv.url("/files/a.jpg?size=100&fault=truncate")``.  True/False become 1/0;
        values are percent-encoded, so ``to=`` may be a full URL.
        """
        if not path.startswith("/"):
            path = "/" + path
        if query:
            pairs = {k: int(v) if isinstance(v, bool) else v for k, v in query.items()}
            path += ("&" if "?" in path else "?") + urlencode(pairs, quote_via=quote)
        return self.base_url + path

    def file_url(self, name: str, **query: object) -> str:
        """URL of synthetic file ``name`` (percent-encoded; ``/`` kept), e.g. size=100."""
        return self.url("/files/" + quote(name, safe="/"), **query)
