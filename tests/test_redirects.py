"""Redirects: followed within limits, never to other schemes, credentials kept home."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import swarmget
from swarmget.testing import ScriptedConnection, TestServer, expected_body


@pytest.fixture(scope="module")
def server() -> Iterator[TestServer]:
    with TestServer() as srv:
        yield srv


@pytest.fixture(scope="module")
def other() -> Iterator[TestServer]:
    with TestServer() as srv:
        yield srv


def run(urls: list[str], out: Path, **options: Any) -> swarmget.Report:
    options.setdefault("retries", 0)
    return swarmget.download(urls, out, **options)


def journal(out: Path) -> list[dict[str, Any]]:
    text = (out / ".swarmget" / "manifest.jsonl").read_text()
    return [json.loads(line) for line in text.splitlines()]


def chain(server: TestServer, codes: list[int], final: str) -> str:
    url = final
    for code in reversed(codes):
        url = server.url("/files/hop.bin", redirect=code, to=url)
    return url


@pytest.mark.parametrize("code", [301, 302, 303, 307, 308])
def test_each_redirect_status_is_followed(server: TestServer, out_dir: Path, code: int) -> None:
    final = server.file_url("target.bin", size=1234)
    start = server.file_url("start.bin", redirect=code, to=final)
    report = run([start], out_dir)
    assert report.ok == 1
    # Named after the URL the user asked for; the manifest says where it came from.
    assert (out_dir / "start.bin").read_bytes() == expected_body("target.bin", 1234)
    record = journal(out_dir)[0]
    assert record["url"] == start and record["final_url"] == final
    assert record["attempts"] == 1


@pytest.mark.parametrize("code", [300, 399])
def test_a_300_or_an_unknown_3xx_with_a_location_is_followed(
    server: TestServer, out_dir: Path, code: int
) -> None:
    # As curl -L follows them (RFC 9110: the Location is the server's choice);
    # they failed as http_300 / http_399.
    final = server.file_url("chosen.bin", size=321)
    start = server.file_url("choices.bin", redirect=code, to=final)
    report = run([start], out_dir)
    assert report.ok == 1, report.failures
    assert (out_dir / "choices.bin").read_bytes() == expected_body("chosen.bin", 321)
    assert journal(out_dir)[0]["final_url"] == final


@pytest.mark.parametrize("code", [304, 305, 306])
def test_a_304_or_a_use_proxy_is_never_followed(
    server: TestServer, out_dir: Path, code: int
) -> None:
    start = server.file_url("proxy.bin", redirect=code, to=server.file_url("elsewhere.bin"))
    report = run([start], out_dir)
    (failure,) = report.failures
    assert failure.error == f"http_{code}"
    assert not (out_dir / "proxy.bin").exists()


def test_a_300_without_a_location_fails_as_its_status(server: TestServer, out_dir: Path) -> None:
    report = run([server.file_url("choices.bin", status=300)], out_dir)
    (failure,) = report.failures
    assert failure.error == "http_300"


def test_a_chain_across_origins(server: TestServer, other: TestServer, out_dir: Path) -> None:
    final = other.file_url("far.bin", size=777)
    start = chain(server, [301, 302, 307, 308], final)
    report = run([start], out_dir)
    assert report.ok == 1
    assert (out_dir / "hop.bin").read_bytes() == expected_body("far.bin", 777)


def test_relative_location(server: TestServer, out_dir: Path) -> None:
    def handler(head: bytes, conn: ScriptedConnection) -> None:
        conn.send(
            b"HTTP/1.1 302 Found\r\nLocation: files/rel.bin?size=99\r\nContent-Length: 0\r\n\r\n"
        )

    server.route("/rel-start", handler)
    try:
        report = run([server.url("/rel-start")], out_dir)
        assert report.ok == 1
        assert (out_dir / "rel-start").read_bytes() == expected_body("rel.bin", 99)
    finally:
        server.unroute("/rel-start")


@pytest.mark.parametrize(
    ("raw", "wire"),
    [
        (b"caf\xc3\xa9.bin", "caf%C3%A9.bin"),  # UTF-8, as nearly every server sends it
        (b"caf\xe9.bin", "caf%E9.bin"),  # not UTF-8: the server's own byte, escaped
        (b"caf%C3%A9.bin", "caf%C3%A9.bin"),  # already escaped: left alone
    ],
)
def test_a_location_with_raw_non_ascii_bytes_is_requested_as_the_server_meant(
    server: TestServer, out_dir: Path, raw: bytes, wire: str
) -> None:
    def redirect(head: bytes, conn: ScriptedConnection) -> None:
        conn.send(
            b"HTTP/1.1 302 Found\r\nLocation: /raw-end/" + raw + b"\r\nContent-Length: 0\r\n\r\n"
        )

    def landing(head: bytes, conn: ScriptedConnection) -> None:
        conn.send(b"HTTP/1.1 200 OK\r\nContent-Length: 7\r\n\r\nlanded!")

    server.route("/raw-start", redirect)
    server.route(f"/raw-end/{wire}", landing)  # only the right bytes find it: else a 404
    try:
        report = run([server.url("/raw-start")], out_dir)
        assert report.ok == 1, journal(out_dir)
        assert (out_dir / "raw-start").read_bytes() == b"landed!"
    finally:
        server.unroute("/raw-start")
        server.unroute(f"/raw-end/{wire}")


def test_too_many_redirects(server: TestServer, out_dir: Path) -> None:
    final = server.file_url("t.bin", size=10)
    report = run([chain(server, [301, 301, 301], final)], out_dir, max_redirects=2)
    assert report.failures[0].error == "too_many_redirects"
    assert not (out_dir / "hop.bin").exists()
    report = run([chain(server, [301, 301], final)], out_dir, max_redirects=2)
    assert report.ok == 1


def test_redirect_loop_ends(server: TestServer, out_dir: Path) -> None:
    def handler(head: bytes, conn: ScriptedConnection) -> None:
        conn.send(b"HTTP/1.1 302 Found\r\nLocation: /loop\r\nContent-Length: 0\r\n\r\n")

    server.route("/loop", handler)
    try:
        report = run([server.url("/loop")], out_dir)
        assert report.failures[0].error == "too_many_redirects"
        assert report.failures[0].http_status is None or report.failures[0].http_status == 302
    finally:
        server.unroute("/loop")


@pytest.mark.parametrize(
    "target",
    [
        "http://u2:s3cr3t@127.0.0.1:{port}/leak",  # followed until too_many_redirects
        "http://u2:s3/cr3t@127.0.0.1:99999/x",  # a password with a "/": does not split
        "//u2:s3cr3t@127.0.0.1:{port}/leak",  # scheme-relative
        "http://u2:s3'cr3t@127.0.0.1:{port}/leak",  # a quote, legal in userinfo
        "http://u2:s3cr3t(x)@127.0.0.1:99999/x",
        "//s3cr3t@127.0.0.1:{port}/leak?scope=@x",  # a token, and an @ in the query
    ],
)
def test_a_password_in_a_location_never_reaches_the_manifest(
    server: TestServer, out_dir: Path, target: str
) -> None:
    location = target.format(port=server.port).encode()

    def handler(head: bytes, conn: ScriptedConnection) -> None:
        conn.send(b"HTTP/1.1 302 Found\r\nLocation: " + location + b"\r\nContent-Length: 0\r\n\r\n")

    with server.routed("/leak", handler) as url:
        report = run([url], out_dir, max_redirects=3)
    assert report.failures[0].error in ("too_many_redirects", "bad_redirect")
    text = (out_dir / ".swarmget" / "manifest.jsonl").read_text()
    assert "s3cr3t" not in text and "cr3t" not in text, text
    assert "***@" in report.failures[0].message or "is hidden" in report.failures[0].message


def test_an_at_sign_in_a_path_is_not_taken_for_a_password() -> None:
    from swarmget.engine.urls import hide_userinfo, redact_text

    for url in [
        "https://cdn.test/@v/1.2/a.js",
        "http://h/p@x",
        "http://h:8080/@scope/pkg",
        "http://[::1]:8080/@scope/pkg",
        "http://[::1]:99/a?x=b@c",
    ]:
        assert hide_userinfo(url) == url
        assert redact_text(f"redirect loop (last to {url!r})") == f"redirect loop (last to {url!r})"
    assert hide_userinfo("http://u:pa/ss@h/x") == "http://***@h/x"
    assert hide_userinfo("http://TOKEN@h/x") == "http://***@h/x"
    # A token in the authority, and an @ in the path too (an npm-style scope).
    assert hide_userinfo("//TOKEN@h/@scope/loop") == "//***@h/@scope/loop"
    assert hide_userinfo("http://TOKEN@h:8080/x?mail=a@b") == "http://***@h:8080/x?mail=a@b"
    assert hide_userinfo("http://u:p@[::1]:80/@x") == "http://***@[::1]:80/@x"
    # An @ and a "/" both in the password: what follows the first @ is no host.
    assert hide_userinfo("http://a@b:p/ss@h/x") == "http://***@h/x"


@pytest.mark.parametrize(
    "location",
    ["file:///etc/passwd", "ftp://127.0.0.1/x", "gopher://127.0.0.1/x", "data:text/plain,hi"],
)
def test_redirects_to_other_schemes_are_refused(
    server: TestServer, out_dir: Path, location: str
) -> None:
    report = run([server.file_url("s.bin", redirect=302, to=location)], out_dir)
    assert report.failures[0].error == "bad_redirect"
    assert not (out_dir / "s.bin").exists()


def test_redirect_with_a_big_body_is_followed_without_reading_it(
    server: TestServer, out_dir: Path
) -> None:
    def handler(head: bytes, conn: ScriptedConnection) -> None:
        location = server.file_url("big-target.bin", size=50).encode()
        conn.send(
            b"HTTP/1.1 302 Found\r\nLocation: " + location + b"\r\nContent-Length: 10000000\r\n\r\n"
        )
        conn.send(b"x" * 100000)

    server.route("/bigredirect", handler)
    try:
        report = run([server.url("/bigredirect")], out_dir, timeout=2)
        assert report.ok == 1
        assert (out_dir / "bigredirect").read_bytes() == expected_body("big-target.bin", 50)
    finally:
        server.unroute("/bigredirect")


def test_credentials_stay_with_the_first_origin(
    server: TestServer, other: TestServer, out_dir: Path
) -> None:
    headers = {"Authorization": "Bearer secret", "Cookie": "a=b", "X-Custom": "kept"}
    same = server.file_url("same.bin", size=5, redirect=302, to=server.file_url("s2.bin", size=5))
    cross = server.file_url("cross.bin", size=5, redirect=302, to=other.file_url("o.bin", size=5))
    before_server, before_other = len(server.requests), len(other.requests)
    report = run([same, cross], out_dir, headers=headers, concurrency=1)
    assert report.ok == 2
    to_server = [r.lower() for r in server.requests[before_server:]]
    to_other = [r.lower() for r in other.requests[before_other:]]
    assert len(to_server) == 3 and len(to_other) == 1
    for request in to_server:
        assert b"authorization: bearer secret" in request and b"cookie: a=b" in request
        assert b"x-custom: kept" in request
    assert b"authorization" not in to_other[0] and b"cookie" not in to_other[0]
    assert b"x-custom: kept" in to_other[0]


def _fields(request: bytes, name: bytes) -> list[bytes]:
    return [
        line.split(b":", 1)[1].strip()
        for line in request.split(b"\r\n")[1:]
        if line.split(b":", 1)[0].strip().lower() == name
    ]


def test_a_host_header_of_the_users_replaces_ours_on_the_first_origin(
    server: TestServer, other: TestServer, out_dir: Path
) -> None:
    # It went out beside ours (two Host fields: servers answer 400), and so did
    # a "user-agent" spelled otherwise than ours.  As curl: the user's Host
    # goes to each row's own origin, and ours after a redirect leaves it.
    headers = {"Host": "vhost.test", "user-agent": "mine/1", "accept": "image/*"}
    plain = server.file_url("vh.bin", size=5)
    cross = server.file_url("vx.bin", size=5, redirect=302, to=other.file_url("vo.bin", size=5))
    before_server, before_other = len(server.requests), len(other.requests)
    report = run([plain, cross], out_dir, headers=headers, concurrency=1)
    assert report.ok == 2
    to_server = server.requests[before_server:]
    (to_other,) = other.requests[before_other:]
    assert len(to_server) == 2
    for request in to_server:
        assert _fields(request, b"host") == [b"vhost.test"]
    assert _fields(to_other, b"host") == [f"127.0.0.1:{other.port}".encode()]
    for request in [*to_server, to_other]:
        assert _fields(request, b"user-agent") == [b"mine/1"]
        assert _fields(request, b"accept") == [b"image/*"]


def test_credentials_go_again_when_a_redirect_comes_back_to_the_first_origin(
    server: TestServer, other: TestServer, out_dir: Path
) -> None:
    # A detour through another host (a sign-in or CDN check) that sends the
    # row back home: curl sends the first host its credentials again
    # (Curl_auth_allowed_to_host); they stayed dropped, and the row failed 401.
    home = server.file_url("home.bin", size=5)
    detour = other.file_url("detour.bin", redirect=302, to=home)
    start = server.file_url("start.bin", redirect=302, to=detour)
    plain, with_password = start, start.replace("http://", "http://bob:s3cret@")
    headers = {"Authorization": "Bearer secret", "Cookie": "a=b"}
    for url, options, sent in [
        (plain, {"headers": headers}, [b"Bearer secret"]),
        (with_password, {}, [b"Basic Ym9iOnMzY3JldA=="]),
    ]:
        before_server, before_other = len(server.requests), len(other.requests)
        assert run([url], out_dir / str(len(sent[0])), **options).ok == 1
        first, back = server.requests[before_server:]
        (away,) = other.requests[before_other:]
        assert _fields(first, b"authorization") == sent == _fields(back, b"authorization")
        assert _fields(away, b"authorization") == [] and _fields(away, b"cookie") == []
        assert _fields(back, b"cookie") == _fields(first, b"cookie")


def test_credentials_in_a_same_origin_location_are_sent(server: TestServer, out_dir: Path) -> None:
    # They were dropped (the row failed 401); curl sends them.
    final = server.file_url("uf.bin", size=5).replace("http://", "http://bob:s3cret@")
    seen = len(server.requests)
    report = run([server.file_url("us.bin", redirect=302, to=final)], out_dir)
    assert report.ok == 1
    last = server.requests[seen:][-1]
    assert _fields(last, b"authorization") == [b"Basic Ym9iOnMzY3JldA=="]


def test_an_authorization_header_of_the_users_replaces_url_credentials(
    server: TestServer, out_dir: Path
) -> None:
    """Both went out, two Authorization fields; curl sends the user's header alone."""
    url = server.file_url("ua.bin", size=5).replace("http://", "http://bob:s3cret@")
    seen = len(server.requests)
    report = run([url], out_dir, headers={"authorization": "Bearer X"})
    assert report.ok == 1
    assert _fields(server.requests[seen], b"authorization") == [b"Bearer X"]
    seen = len(server.requests)
    assert run([url], out_dir / "plain").ok == 1  # without one, the URL's are sent
    assert _fields(server.requests[seen], b"authorization") == [b"Basic Ym9iOnMzY3JldA=="]


def test_https_to_http_downgrade_is_refused_unless_allowed() -> None:
    from swarmget.engine.job import Job
    from swarmget.engine.redirects import redirect_target
    from swarmget.engine.urls import split_url
    from swarmget.errors import TransferError
    from swarmget.options import Options
    from swarmget.sinks.base import Assignment

    url = "https://a.example/x"
    job = Job(Assignment(0, 7, url, "x"), split_url(url))
    with pytest.raises(TransferError) as info:
        redirect_target(job, b"http://a.example/y", Options())
    assert info.value.code == "bad_redirect"
    allowed = redirect_target(job, b"http://a.example/y", Options(allow_downgrade=True))
    assert allowed == "http://a.example/y"
    assert redirect_target(job, b"/z", Options()) == "https://a.example/z"
    # The refusal quotes the target without its password (a space or a quote in
    # it ended what a search of the message could take for a URL).
    for secret in (b"S3 cr", b"S3'cr"):
        with pytest.raises(TransferError) as info:
            redirect_target(job, b"http://u:" + secret + b"@a.example/y", Options())
        assert secret.decode() not in info.value.message and "***@" in info.value.message


@pytest.mark.parametrize(
    ("location", "target"),
    [
        ("http:///b.test/x", "http://b.test/x"),  # browsers and curl: the host
        ("http:\\\\b.test\\x", "http://b.test\\x"),
        ("https:/b.test/x", "https://b.test/x"),  # another scheme: an authority
        ("https:b.test/x", "https://b.test/x"),
        ("http:/b.test/x", "http://a.test/b.test/x"),  # the same scheme: relative
        ("http:x", "http://a.test/dir/x"),
        ("//b.test/x", "http://b.test/x"),
        ("///b.test/x", "http://b.test/x"),  # curl and browsers: the host (was a path here)
    ],
)
def test_a_location_with_odd_slashes_names_what_browsers_name(location: str, target: str) -> None:
    from swarmget.engine.job import Job
    from swarmget.engine.redirects import redirect_target
    from swarmget.engine.urls import split_url
    from swarmget.options import Options
    from swarmget.sinks.base import Assignment

    url = "http://a.test/dir/page"
    job = Job(Assignment(0, 7, url, "x"), split_url(url))
    assert redirect_target(job, location.encode(), Options()) == target


@pytest.mark.parametrize(
    "location", ["http://", "http:///", "HTTP://?q", "//", "///", "//?x", "http://#f", "https:"]
)
def test_a_location_with_an_empty_host_is_refused(location: str) -> None:
    # urljoin filled the host in from the page: "http://?q" fetched the page
    # itself with another query (a file that is not the one asked for), and
    # "http://" looped until too_many_redirects.  curl: "No host part".
    from swarmget.engine.job import Job
    from swarmget.engine.redirects import redirect_target
    from swarmget.engine.urls import split_url
    from swarmget.errors import TransferError
    from swarmget.options import Options
    from swarmget.sinks.base import Assignment

    url = "http://a.test/dir/page?x=1"
    job = Job(Assignment(0, 7, url, "x"), split_url(url))
    with pytest.raises(TransferError) as info:
        redirect_target(job, location.encode(), Options())
    assert info.value.code == "bad_redirect"
    assert "no host" in info.value.message and repr(location) in info.value.message


def test_a_redirect_to_an_empty_host_fails_the_row_at_once(
    server: TestServer, out_dir: Path
) -> None:
    seen = len(server.requests)
    report = run([server.file_url("nohost.bin", redirect=302, to="http://?q=1")], out_dir)
    (failure,) = report.failures
    assert failure.error == "bad_redirect" and "no host" in failure.message
    assert len(server.requests) == seen + 1  # the page itself was not asked for again


def test_conflicting_locations_are_quoted_without_their_passwords(
    server: TestServer, out_dir: Path
) -> None:
    # The refusal quoted both values as they came: a token in a scheme-relative
    # one, and a password with a space (which ends what a search of the message
    # takes for a URL), reached the manifest and the terminal.
    def handler(head: bytes, conn: ScriptedConnection) -> None:
        conn.send(
            b"HTTP/1.1 302 Found\r\nLocation: http://u:s3 cr3t@127.0.0.2/x\r\n"
            b"Location: //tok3n@127.0.0.2/y\r\nContent-Length: 0\r\n\r\n"
        )

    with server.routed("/two-locations", handler) as url:
        report = run([url], out_dir)
    (failure,) = report.failures
    assert failure.error == "protocol" and "conflicting Location" in failure.message
    assert failure.message.count("***@127.0.0.2") == 2, failure.message
    text = (out_dir / ".swarmget" / "manifest.jsonl").read_text()
    for secret in ("s3 cr3t", "cr3t", "tok3n"):
        assert secret not in text and secret not in failure.message


def test_a_retry_starts_again_at_the_url_asked_for(
    server: TestServer, other: TestServer, out_dir: Path
) -> None:
    # A redirector (a mirror network, an API handing out presigned URLs) sent
    # the row to a target that failed: the retry went to that target again,
    # where a mirror that is down or a link that has expired fails it for
    # good.  curl --retry asks the first URL again, and so do we.
    target = other.file_url("mirror.bin", size=5000, status=503, times=1)
    start = server.file_url("asked.bin", redirect=302, to=target)
    seen_start, seen_target = len(server.requests), len(other.requests)
    report = run([start], out_dir, retries=2)
    assert report.ok == 1
    assert (out_dir / "asked.bin").read_bytes() == expected_body("mirror.bin", 5000)
    assert len(server.requests) - seen_start == 2  # asked again, redirected again
    assert len(other.requests) - seen_target == 2
    record = journal(out_dir)[0]
    assert (record["final_url"], record["attempts"]) == (target, 2)


def test_a_location_with_a_tab_inside_is_a_bad_redirect(server: TestServer, out_dir: Path) -> None:
    # urljoin dropped the tab: the row was saved with /files/tabx.bin, a file
    # the server never named (curl refuses the Location: "Bad path").
    seen = len(server.requests)
    report = run([server.file_url("tabbed.bin", redirect=302, to="/files/tab\tx.bin")], out_dir)
    (failure,) = report.failures
    assert failure.error == "bad_redirect" and "a tab inside it" in failure.message
    assert len(server.requests) == seen + 1  # nothing was asked for at the mangled URL
    assert not (out_dir / "tabbed.bin").exists()


@pytest.mark.parametrize("location", ["?", "?#top", "./query.bin?"])
def test_a_location_with_an_empty_query_asks_for_that_empty_query(
    server: TestServer, out_dir: Path, location: str
) -> None:
    # RFC 3986 section 5.2.2: "?" is this path with an empty query.  urljoin
    # took the page's own query for an empty one: "?" asked for the page
    # again (here a loop, too_many_redirects; a server that drops a token or
    # a tracking query this way got the old URL back), and "x?" lost its "?".
    start = server.file_url("query.bin", size=10, redirect=302, to=location)
    seen = len(server.requests)
    report = run([start], out_dir)
    assert report.ok == 1, report.failures
    request_lines = [head.partition(b"\r\n")[0] for head in server.requests[seen:]]
    assert request_lines[1:] == [b"GET /files/query.bin? HTTP/1.1"]


@pytest.mark.parametrize(
    ("location", "fragment"),
    [("/files/landed.bin?size=5", "#part-2"), ("/files/landed.bin?size=5#own", "#own")],
)
def test_a_location_without_a_fragment_inherits_the_rows_fragment(
    server: TestServer, out_dir: Path, location: str, fragment: str
) -> None:
    # RFC 9110 section 10.2.2: the redirect keeps the fragment of the URL asked
    # for when the Location has none of its own (as browsers do); final_url
    # lost it.  The fragment is never sent.
    start = server.file_url("fragment.bin", redirect=302, to=location) + "#part-2"
    seen = len(server.requests)
    report = run([start], out_dir)
    assert report.ok == 1, report.failures
    assert journal(out_dir)[0]["final_url"] == server.url("/files/landed.bin?size=5") + fragment
    assert all(b"#" not in head.partition(b"\r\n")[0] for head in server.requests[seen:])
