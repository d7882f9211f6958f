"""A redirect chain configured in a real nginx."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import swarmget
from swarmget.testing.nginx import Nginx, TlsFiles, expected_file_bytes, make_tree

LOCATIONS = """
location = /start { return 301 /hop1; }
location = /hop1 { return 302 /hop2; }
location = /hop2 { return 307 /hop3; }
location = /hop3 { return 308 /img000003.jpg; }
location = /loop { return 302 /loop; }
location = /escape { return 302 file:///etc/passwd; }
location = /down { return 302 http://127.0.0.1:9/img000001.jpg; }
"""


@pytest.fixture(scope="module", params=["http", "https"])
def nginx(
    request: pytest.FixtureRequest,
    nginx_bin: str,
    tls_files: TlsFiles,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Nginx]:
    root = tmp_path_factory.mktemp("www")
    make_tree(root, 5, 4096)
    ssl = tls_files.server if request.param == "https" else None
    with Nginx(root, extra_locations=LOCATIONS, ssl=ssl) as server:
        yield server


@pytest.fixture
def opts(tls_files: TlsFiles) -> dict[str, Any]:
    return {"retries": 0, "cacert": str(tls_files.ca_pem)}


def test_chain_of_four_redirects(nginx: Nginx, out_dir: Path, opts: dict[str, Any]) -> None:
    report = swarmget.download([nginx.url("/start")], out_dir, **opts)
    assert report.ok == 1
    assert (out_dir / "start").read_bytes() == expected_file_bytes("img000003.jpg", 4096)
    record = json.loads((out_dir / ".swarmget/manifest.jsonl").read_text())
    assert record["final_url"] == nginx.url("/img000003.jpg")


def test_chain_longer_than_the_limit(nginx: Nginx, out_dir: Path, opts: dict[str, Any]) -> None:
    report = swarmget.download([nginx.url("/start")], out_dir, max_redirects=3, **opts)
    assert report.failures[0].error == "too_many_redirects"


def test_loop_and_scheme_escape(nginx: Nginx, out_dir: Path, opts: dict[str, Any]) -> None:
    report = swarmget.download(
        [nginx.url("/loop"), nginx.url("/escape")], out_dir, concurrency=1, **opts
    )
    errors = sorted(f.error or "" for f in report.failures)
    assert errors == ["bad_redirect", "too_many_redirects"]
    assert sorted(p.name for p in out_dir.iterdir()) == [".swarmget"]


def test_https_to_http_downgrade_is_refused(
    nginx: Nginx, out_dir: Path, opts: dict[str, Any]
) -> None:
    if not nginx.base_url.startswith("https"):
        pytest.skip("only an https origin can be downgraded")
    report = swarmget.download([nginx.url("/down")], out_dir, **opts)
    assert report.failures[0].error == "bad_redirect"
    assert "allow-downgrade" in (report.failures[0].message or "")
