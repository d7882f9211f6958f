"""rename_noreplace: one system call that moves a file only where none is."""

from __future__ import annotations

from pathlib import Path

import pytest

import swarmget.sinks.noreplace
from swarmget.sinks.noreplace import rename_noreplace


def test_it_moves_a_file_to_a_free_name(tmp_path: Path) -> None:
    (tmp_path / "part").write_bytes(b"body")
    assert rename_noreplace(str(tmp_path / "part"), str(tmp_path / "final")) is True
    assert (tmp_path / "final").read_bytes() == b"body"
    assert not (tmp_path / "part").exists()


@pytest.mark.parametrize("there", ["file", "dangling symlink", "directory"])
def test_it_never_replaces_what_is_at_the_name(there: str, tmp_path: Path) -> None:
    (tmp_path / "part").write_bytes(b"body")
    final = tmp_path / "final"
    if there == "file":
        final.write_bytes(b"USER DATA")
    elif there == "directory":
        final.mkdir()
    else:
        final.symlink_to(tmp_path / "nowhere")
    with pytest.raises(FileExistsError):
        rename_noreplace(str(tmp_path / "part"), str(final))
    assert (tmp_path / "part").read_bytes() == b"body"
    assert final.is_symlink() or final.is_dir() or final.read_bytes() == b"USER DATA"
    assert not (tmp_path / "nowhere").exists()


def test_other_failures_are_the_os_error(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        rename_noreplace(str(tmp_path / "missing"), str(tmp_path / "final"))


def test_a_system_without_it_says_so_and_moves_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(swarmget.sinks.noreplace, "_renameat2", None)
    (tmp_path / "part").write_bytes(b"body")
    assert rename_noreplace(str(tmp_path / "part"), str(tmp_path / "final")) is False
    assert (tmp_path / "part").exists() and not (tmp_path / "final").exists()
