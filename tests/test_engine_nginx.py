"""End-to-end downloads from a real nginx on loopback, checked byte for byte."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import swarmget
from swarmget.testing.nginx import Nginx, ServedTree
from swarmget.testing.outputs import parts


def manifest(out: Path) -> list[dict[str, object]]:
    lines = (out / ".swarmget" / "manifest.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines]


def test_2500_files_byte_for_byte(nginx_server: ServedTree, out_dir: Path) -> None:
    report = swarmget.download(nginx_server.urls(), out_dir, concurrency=64, per_host=64)
    assert (report.ok, report.failed) == (len(nginx_server.names), 0)
    assert report.bytes == len(nginx_server.names) * nginx_server.size
    for name in nginx_server.names:
        assert (out_dir / name).read_bytes() == nginx_server.expected(name), name
    assert parts(out_dir) == []
    records = manifest(out_dir)
    assert len(records) == len(nginx_server.names)
    assert {r["status"] for r in records} == {"ok"}
    assert all(r["http_status"] == 200 and r["bytes"] == nginx_server.size for r in records)
    assert {r["path"] for r in records} == set(nginx_server.names)


@pytest.fixture(scope="module")
def numbered_nginx(nginx_server: ServedTree) -> Iterator[Nginx]:
    """nginx whose ``/conn/ANY`` answers with the serial number of the connection
    it came on (``$connection``, unique across workers): nginx itself says how
    many connections a run opened."""
    location = 'location /conn/ { default_type text/plain; return 200 "$connection"; }'
    with Nginx(nginx_server.root, workers=2, extra_locations=location) as nginx:
        yield nginx


def connections_used(nginx: Nginx, out: Path, count: int, **options: Any) -> set[bytes]:
    urls = [nginx.url(f"conn/c{i}") for i in range(count)]
    report = swarmget.download(urls, out, **options)
    assert report.ok == count
    return {(out / f"c{i}").read_bytes() for i in range(count)}


def test_keep_alive_connections_are_reused(numbered_nginx: Nginx, out_dir: Path) -> None:
    # 400 files over 4 connections: each connection is opened once, then reused.
    used = connections_used(numbered_nginx, out_dir, 400, concurrency=4, per_host=4)
    assert 1 <= len(used) <= 4, used
    assert all(serial.isdigit() for serial in used)


def test_a_short_keep_alive_timeout_costs_no_file_and_no_attempt(
    nginx_server: ServedTree, out_dir: Path
) -> None:
    # nginx drops a connection idle for 5 ms.  Requests went out on connections
    # it had just closed (their end of file not yet seen), and the retry of such
    # a request went out on another old one: 776 of 3,000 rows failed with
    # --retries 0, and more used up their retries.
    location = f"location /short/ {{ alias {nginx_server.root}/; keepalive_timeout 5ms; }}"
    with Nginx(nginx_server.root, extra_locations=location) as nginx:
        urls = [nginx.url(f"short/{name}") for name in nginx_server.names]
        report = swarmget.download(
            urls, out_dir, workers=1, concurrency=200, per_host=200, retries=0
        )
    assert (report.ok, report.failed) == (len(urls), 0), report.error_counts()
    assert {r["attempts"] for r in manifest(out_dir)} == {1}


def test_missing_files_fail_with_http_404_and_leave_nothing(
    nginx_server: ServedTree, out_dir: Path
) -> None:
    urls = [nginx_server.url(nginx_server.names[0]), nginx_server.url("no-such-file.jpg")]
    report = swarmget.download(urls, out_dir, retries=0)
    assert (report.ok, report.failed) == (1, 1)
    failure = report.failures[0]
    assert failure.error == "http_404"
    assert failure.http_status == 404
    assert not (out_dir / "no-such-file.jpg").exists()
    assert parts(out_dir) == []
    by_url = {r["url"]: r for r in manifest(out_dir)}
    assert by_url[urls[1]]["status"] == "failed"
    assert by_url[urls[1]]["path"] is None
    assert by_url[urls[1]]["error"] == "http_404"


def test_per_host_limit_caps_connections(numbered_nginx: Nginx, out_dir: Path) -> None:
    # concurrency 50 but per_host 3: never more than 3 connections to the one
    # host, so (as none is closed) no more than 3 ever opened.
    used = connections_used(numbered_nginx, out_dir, 300, concurrency=50, per_host=3)
    assert 1 <= len(used) <= 3, used
