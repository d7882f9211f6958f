"""A redirect chain configured in a real nginx."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

import swarmget
from swarmget.testing.nginx import Nginx, expected_file_bytes, make_tree

LOCATIONS = """
location = /start { return 301 /hop1; }
location = /hop1 { return 302 /hop2; }
location = /hop2 { return 307 /hop3; }
location = /hop3 { return 308 /img000003.jpg; }
location = /loop { return 302 /loop; }
location = /escape { return 302 file:///etc/passwd; }
"""


@pytest.fixture(scope="module")
def nginx(nginx_bin: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Nginx]:
    root = tmp_path_factory.mktemp("www")
    make_tree(root, 5, 4096)
    with Nginx(root, extra_locations=LOCATIONS) as server:
        yield server


def test_chain_of_four_redirects(nginx: Nginx, out_dir: Path) -> None:
    report = swarmget.download([nginx.url("/start")], out_dir, retries=0)
    assert report.ok == 1
    assert (out_dir / "start").read_bytes() == expected_file_bytes("img000003.jpg", 4096)
    record = json.loads((out_dir / ".swarmget/manifest.jsonl").read_text())
    assert record["final_url"] == nginx.url("/img000003.jpg")


def test_chain_longer_than_the_limit(nginx: Nginx, out_dir: Path) -> None:
    report = swarmget.download([nginx.url("/start")], out_dir, retries=0, max_redirects=3)
    assert report.failures[0].error == "too_many_redirects"


def test_loop_and_scheme_escape(nginx: Nginx, out_dir: Path) -> None:
    report = swarmget.download(
        [nginx.url("/loop"), nginx.url("/escape")], out_dir, retries=0, concurrency=1
    )
    errors = sorted(f.error or "" for f in report.failures)
    assert errors == ["bad_redirect", "too_many_redirects"]
    assert sorted(p.name for p in out_dir.iterdir()) == [".swarmget"]
