"""Where a redirect may lead: only http(s), within a hop limit, no silent downgrade."""

from __future__ import annotations

from urllib.parse import urljoin, urlsplit

from swarmget.engine.job import Job
from swarmget.errors import ErrorCode, TransferError
from swarmget.options import Options

REDIRECT_STATUSES = frozenset({301, 302, 303, 307, 308})


def redirect_target(job: Job, location: bytes, options: Options) -> str:
    """The URL a 3xx sends ``job`` to, or a ``bad_redirect``/``too_many_redirects`` error."""
    if job.redirects >= options.max_redirects:
        raise TransferError(
            ErrorCode.TOO_MANY_REDIRECTS,
            f"more than {options.max_redirects} redirects (last to {location!r})",
        )
    try:
        target = urljoin(job.url, location.decode("latin-1").strip())
        scheme = urlsplit(target).scheme.lower()
    except ValueError as exc:  # e.g. "http://[not-an-address]/": urlsplit checks brackets
        raise TransferError(
            ErrorCode.BAD_REDIRECT, f"redirect to an invalid URL ({location!r}): {exc}"
        ) from None
    if scheme not in ("http", "https"):
        # file:, ftp:, data:... are never followed, and nothing local is read.
        raise TransferError(ErrorCode.BAD_REDIRECT, f"redirect to a {scheme or 'relative'} URL")
    if job.origin[0] == "https" and scheme == "http" and not options.allow_downgrade:
        raise TransferError(
            ErrorCode.BAD_REDIRECT,
            f"redirect from https to http refused ({target}); --allow-downgrade permits it",
        )
    return target
