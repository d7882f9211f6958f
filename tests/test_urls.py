"""URLs as the engine takes them: host names checked and put in the form the wire takes."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

import swarmget
from swarmget.engine.urls import split_url
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
        ("http://EXAMPLE.test/x", ("http", "example.test", 80), "example.test"),
        ("http://a_b.test/x", ("http", "a_b.test", 80), "a_b.test"),  # seen in the wild
        ("http://[::1]:81/x", ("http", "::1", 81), "[::1]:81"),
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
        "http://a$b.test/x",
        "http://" + "\u00e9" * 70 + ".test/x",  # a label too long for IDNA
        "http://[fe80::1%zz!]/x",
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
    ]
    report = swarmget.download(urls, tmp_path, retries=0, workers=1)
    assert report.failed == 2
    errors = [r["error"] for r in swarmget.read_manifest(tmp_path)]
    assert errors == ["bad_redirect", "bad_redirect"]
