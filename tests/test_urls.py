"""URLs as the engine takes them: host names checked and put in the form the wire takes."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest

import swarmget
from swarmget.engine.urls import UrlSplitter, ipv4_normalize, split_url
from swarmget.errors import TransferError
from swarmget.testing import TestServer


@pytest.fixture(scope="module")
def server() -> Iterator[TestServer]:
    with TestServer() as srv:
        yield srv


@pytest.mark.parametrize(
    ("url", "origin", "host_header"),
    [
        # International names go out in their IDNA form, as curl sends them.
        ("http://\u4e00.test/x", ("http", "xn--4gq.test", 80), "xn--4gq.test"),
        (
            "https://\u00e9xample.test:8443/x",
            ("https", "xn--xample-9ua.test", 8443),
            "xn--xample-9ua.test:8443",
        ),
        # IDNA2008 with UTS 46 non-transitional mapping, as curl and browsers:
        # IDNA2003 made these fass.de and xn--mxa0b.gr, other domains.
        ("http://fa\u00df.de/x", ("http", "xn--fa-hia.de", 80), "xn--fa-hia.de"),
        ("http://\u03b1\u03c2.gr/x", ("http", "xn--mxa8a.gr", 80), "xn--mxa8a.gr"),
        ("http://\u2603.net/x", ("http", "xn--n3h.net", 80), "xn--n3h.net"),  # IDNA2003 only
        ("http://EXAMPLE.test/x", ("http", "example.test", 80), "example.test"),
        ("http://%67ood.test/x", ("http", "good.test", 80), "good.test"),  # WHATWG decodes
        ("http://%C3%A9xample.test/x", ("http", "xn--xample-9ua.test", 80), "xn--xample-9ua.test"),
        ("http://a_b.test/x", ("http", "a_b.test", 80), "a_b.test"),  # seen in the wild
        ("http://[::1]:81/x", ("http", "::1", 81), "[::1]:81"),
        # A zone id (RFC 6874's %25, or curl's bare %) reaches the resolver, which
        # makes it the scope id; the server is never told about our interfaces.
        ("http://[fe80::1%25eth0]:81/x", ("http", "fe80::1%eth0", 81), "[fe80::1]:81"),
        ("http://[fe80::1%eth0]/x", ("http", "fe80::1%eth0", 80), "[fe80::1]"),
    ],
)
def test_hosts_take_the_form_dns_tls_and_the_host_header_need(
    url: str, origin: tuple[str, str, int], host_header: str
) -> None:
    location = split_url(url)
    assert (location.origin, location.host_header) == (origin, host_header)


@pytest.mark.parametrize(
    "url",
    [
        "http://a\x00b/x",  # a NUL would reach the resolver and the Host header
        "http://a\x01b.test/x",
        "http://a\x7f/x",
        "http://a b/x",
        "http://a%00b/x",
        "http://a%2Fb/x",  # decoded, a / no host holds
        "http://a%FFb/x",  # not UTF-8
        "http://a$b.test/x",
        "http://" + "\u00e9" * 70 + ".test/x",  # a label too long for IDNA
        "http://[fe80::1%zz!]/x",
        "http://[fe80::1%25]/x",  # an empty zone id
        "http://[::1]x/",  # urlsplit dropped the x
        "http://[::1]x:81/",
        "http://[::1]]:81/x",  # read as [::1]:81
        "http://[v1.x]:81/x",  # read as the name v1.x
        "http://u:p@[::1]]/x",
    ],
)
def test_hosts_no_name_can_be_are_bad_urls(url: str) -> None:
    with pytest.raises(TransferError) as caught:
        split_url(url)
    assert caught.value.code == "bad_url"


def test_an_international_host_fails_alone_and_takes_no_worker_down(
    server: TestServer, tmp_path: Path, nxdomain_dns: str
) -> None:
    # It used to: the Host header could not be encoded, the worker died, and every
    # row it held failed as `crashed`.
    good = [server.file_url(f"g{i}.bin", size=100) for i in range(20)]
    report = swarmget.download(
        [*good, "http://a\u4e00b.test/x", "http://a\x00b/x"],
        tmp_path,
        workers=2,
        retries=0,
        dns_servers=[nxdomain_dns],
    )
    assert report.ok == 20
    records = {r["index"]: r for r in swarmget.read_manifest(tmp_path)}
    assert records[20]["error"] == "dns" and "xn--ab-" in records[20]["message"]
    assert records[21]["error"] == "bad_url"


def test_a_redirect_to_an_invalid_url_is_a_bad_redirect(server: TestServer, tmp_path: Path) -> None:
    urls = [
        server.file_url("r0.bin", redirect=2, to="http://[zz]/x"),  # urlsplit raised here
        server.file_url("r1.bin", redirect=2, to="http://a b/x"),
        server.file_url("r2.bin", redirect=2, to="http://h:99999/x"),
        server.file_url("r3.bin", redirect=2, to="ftp://h/x"),
    ]
    report = swarmget.download(urls, tmp_path, retries=0, workers=1)
    assert report.failed == 4
    records = swarmget.read_manifest(tmp_path)
    assert [r["error"] for r in records] == ["bad_redirect"] * 4
    # Each with the status of the redirect it refused (r2's had none).
    assert [r["http_status"] for r in records] == [302] * 4


@pytest.mark.skipif(not socket.has_ipv6, reason="this machine has no IPv6")
def test_an_ipv6_zone_id_picks_the_interface_and_stays_off_the_wire(tmp_path: Path) -> None:
    # It used to go to the resolver as "::1%25lo" and fail as `dns`.
    loopback = socket.if_indextoname(1)  # "lo" on Linux
    server = TestServer(host="::1")
    try:
        server.start()
    except OSError as exc:
        pytest.skip(f"cannot listen on ::1 here: {exc}")
    try:
        paths = [urlsplit(server.file_url(f"{name}.bin", size=100)).path for name in "ab"]
        urls = [
            f"http://[::1%25{loopback}]:{server.port}{paths[0]}",
            f"http://[::1%251]:{server.port}{paths[1]}",  # the interface by its index
        ]
        report = swarmget.download(urls, tmp_path, workers=1, retries=0)
        hosts = {
            line.split(b":", 1)[1].strip()
            for head in server.requests
            for line in head.split(b"\r\n")
            if line.lower().startswith(b"host:")
        }
    finally:
        server.stop()
    assert report.ok == 2, [r["message"] for r in swarmget.read_manifest(tmp_path)]
    assert hosts == {f"[::1]:{server.port}".encode()}


@pytest.mark.parametrize(
    ("urls", "targets"),
    [
        # A "/" in the query or the fragment of a URL without a path is not where
        # its authority ends: the cache of origins used to take "http://h?x=" for
        # one and send the second URL as "GET /b".
        (["http://h.test?x=/a", "http://h.test?x=/b"], ["/?x=/a", "/?x=/b"]),
        (["http://h.test:81?x=/a/b", "http://h.test:81?x=/c"], ["/?x=/a/b", "/?x=/c"]),
        (["http://h.test#/a", "http://h.test#/b"], ["/", "/"]),
        (["http://h.test/p?x=/a", "http://h.test/q#/b"], ["/p?x=/a", "/q"]),
        # An empty query is sent as it came, as curl sends it, cached or not.
        (["http://h.test/a.jpg?", "http://h.test/b.jpg?#f"], ["/a.jpg?", "/b.jpg?"]),
    ],
)
def test_the_origin_cache_never_changes_a_target(urls: list[str], targets: list[str]) -> None:
    splitter = UrlSplitter()
    assert [splitter.split(url).target for url in urls] == targets
    assert [splitter.split(url).target for url in urls] == targets  # now from the cache
    assert [split_url(url).target for url in urls] == targets


@pytest.mark.parametrize("url", ["http://127.0.0.1:0/x", "https://h.test:0/x", "http://h:00/x"])
def test_port_zero_is_a_bad_url_not_the_default_port(url: str) -> None:
    with pytest.raises(TransferError) as caught:
        split_url(url)
    assert caught.value.code == "bad_url" and "port 0" in caught.value.message


@pytest.mark.parametrize(
    ("host", "address"),
    [
        ("127.1", "127.0.0.1"),
        ("0x7f.0.0.1", "127.0.0.1"),
        ("0177.0.0.1", "127.0.0.1"),  # octal, as curl: the resolver read 177.0.0.1
        ("2130706433", "127.0.0.1"),
        ("0x7F000001", "127.0.0.1"),
        ("010.0.0.1", "8.0.0.1"),
        ("1.65535", "1.0.255.255"),
        ("256.0.0.1", None),  # not an address: a name, as curl has it
        ("08.0.0.1", None),
        ("1.2.3.4.5", None),
        ("127.0.0.1.", None),
        ("4294967296", None),
    ],
)
def test_numeric_hosts_are_read_as_curl_reads_them(host: str, address: str | None) -> None:
    assert ipv4_normalize(host) == address
    if address is not None:
        location = split_url(f"http://{host}:81/x")
        assert location.origin == ("http", address, 81)
        assert location.host_header == f"{address}:81"


def test_a_numeric_host_never_reaches_the_resolver(
    server: TestServer, tmp_path: Path, nxdomain_dns: str
) -> None:
    # "127.1" went to DNS (here: NXDOMAIN) and failed as `dns`.
    url = server.file_url("n.bin", size=10).replace("127.0.0.1", "127.1")
    report = swarmget.download([url], tmp_path, workers=1, retries=0, dns_servers=[nxdomain_dns])
    assert report.ok == 1, report.error_counts()


@pytest.mark.parametrize(
    ("url", "target"),
    [
        ("http://h/a/b/../c/./d", "/a/c/d"),
        ("http://h/../c", "/c"),  # nginx answers 400 to /../c
        ("http://h/a/b/..", "/a/"),
        ("http://h/a/./", "/a/"),
        ("http://h/a/..b/.c", "/a/..b/.c"),  # not dot segments
        ("http://h/a/../b?x=/../y", "/b?x=/../y"),  # the query is not a path
    ],
)
def test_dot_segments_are_removed_as_curl_removes_them(url: str, target: str) -> None:
    assert split_url(url).target == target
    splitter = UrlSplitter()
    splitter.split("http://h/first")  # the origin cached: the fast path too
    assert splitter.split(url).target == target


def test_escaped_credentials_are_sent_as_the_bytes_they_spell() -> None:
    """``p%E4ss`` is Latin-1 ``päss``: the byte E4 goes, not U+FFFD."""
    import base64

    location = split_url("http://u:p%E4ss@h/")
    assert location.authorization == "Basic " + base64.b64encode(b"u:p\xe4ss").decode()
    location = split_url("http://u:p\u00e4ss@h/")  # unescaped text: its UTF-8
    assert location.authorization == "Basic " + base64.b64encode(b"u:p\xc3\xa4ss").decode()


@pytest.mark.parametrize("space", ["\u00a0", "\u3000", "\u2003"])
def test_unicode_spaces_at_the_end_of_a_url_are_part_of_it(
    server: TestServer, tmp_path: Path, space: str
) -> None:
    """Only C0 controls and the space are trimmed (WHATWG): a no-break space at the
    end of a name was trimmed by str.strip(), and another file was saved as ok."""
    url = server.url(f"/files/end{space}")
    source = tmp_path / "urls.txt"
    source.write_text(f"  {url}\r\n", encoding="utf-8")
    from_text = swarmget.download([], tmp_path / "a", sources=[str(source)], retries=0)
    from_list = swarmget.download([f"\t{url} "], tmp_path / "b", retries=0)
    for report in (from_text, from_list):
        assert report.ok == 1, report.failures
    quoted = space.encode().hex().upper()
    wanted = "".join(f"%{quoted[i : i + 2]}" for i in range(0, len(quoted), 2))
    lines = [r.split(b"\r\n", 1)[0] for r in server.requests[-2:]]
    assert lines == [f"GET /files/end{wanted} HTTP/1.1".encode()] * 2


@pytest.mark.parametrize(
    ("line", "said"),
    [
        ("{url}/tab.jpg\ta photo of a cat", "a tab inside the URL"),  # headerless TSV
        ("{url}/tab.jpg\t{url}/mirror/tab.jpg", "a tab inside the URL"),
        ("{url}/n\x002.txt", "control character U+0000"),
        ("{url}/e\x1b[0m.txt", "control character U+001B"),
        ("{url}/del\x7f.txt", "control character U+007F"),
    ],
)
def test_a_control_character_inside_a_url_is_a_bad_url_not_another_url(
    server: TestServer, tmp_path: Path, line: str, said: str
) -> None:
    # urlsplit drops tabs: ``/tab.jpg<TAB>a photo of a cat`` was requested as
    # ``/tab.jpga%20photo%20of%20a%20cat`` and saved under that name (exit 0);
    # the other controls were escaped and sent.  curl refuses all of them.
    source = tmp_path / "urls.txt"
    lines = [server.url("/files/first.txt"), line.format(url=server.url("/files"))]
    source.write_bytes("\n".join(lines).encode("utf-8") + b"\n")  # (a NUL on line 1: binary)
    before = len(server.requests)
    report = swarmget.download([], tmp_path / "out", sources=[str(source)], retries=0)
    assert (report.ok, report.failed) == (1, 1)
    (failure,) = report.failures
    assert failure.error == "bad_url" and said in (failure.message or "")
    assert len(server.requests) == before + 1  # the first line's alone
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [".swarmget", "first.txt"]


def test_a_row_that_is_a_url_without_its_scheme_keeps_its_password_out_of_every_record(
    tmp_path: Path,
) -> None:
    # A bad_url row: its message and its manifest record showed user:secret@.
    listing = tmp_path / "list.txt"
    listing.write_text("http://127.0.0.1:9/first\nuser:secret@host.example/x\n")
    report = swarmget.download([], tmp_path / "out", sources=[str(listing)], retries=0)
    failure = next(f for f in report.failures if f.error == "bad_url")
    assert failure.url == "user:***@host.example/x"
    assert "secret" not in (failure.message or "")
    manifest = (tmp_path / "out" / ".swarmget" / "manifest.jsonl").read_text()
    assert "secret" not in manifest and "user:***@host.example/x" in manifest


def test_a_url_too_long_to_be_served_is_bad_url_and_said_briefly(out_dir: Path) -> None:
    # A 50 MB line went out as a request four times (connect), and its
    # message and record repeated all of it.
    url = "http://127.0.0.1:9/" + "a" * 1_000_000
    with pytest.raises(TransferError) as caught:
        UrlSplitter().split(url)
    assert caught.value.code == "bad_url"
    assert "URL is 1,000,019 characters long (at most 65,536)" in caught.value.message
    assert len(caught.value.message) < 200
    report = swarmget.download([url], out_dir)
    (failure,) = report.failures
    assert (failure.error, failure.attempts) == ("bad_url", 0)


@pytest.mark.parametrize(
    ("url", "hinted"),
    [
        ("http:/h.test/x", True),
        ("http:///h.test/x", True),
        ("HTTP:\\\\h.test\\x", True),
        ("http://", False),
        ("http://:81/x", False),
    ],
)
def test_a_url_with_odd_slashes_says_where_its_host_should_be(url: str, hinted: bool) -> None:
    # curl and browsers find h.test in these; a list that holds one is damaged,
    # and "URL has no host" alone sent the user looking at a host that is there.
    with pytest.raises(TransferError) as caught:
        split_url(url)
    assert caught.value.code == "bad_url" and "no host" in caught.value.message
    assert ("exactly two slashes" in caught.value.message) == hinted
