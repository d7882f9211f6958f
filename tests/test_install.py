"""Installing swarmget the way a user does, into fresh empty virtualenvs.

``pip install`` must never fail on a user's machine and must give the compiled
build wherever it can (setup.py has the why and how).  The rest of the suite
runs a checkout; these tests install one:

- a wheel and an sdist are built from a copy of the checkout, as ``python -m
  build`` does for a release (the wheel from the sdist, so a file the sdist
  forgets fails here), each once per session;
- the wheel and the sdist each go into an empty venv, where the build must be
  the compiled one and ``swarmget demo`` must work;
- with no C compiler (``CC=/bin/false``), and with a type error mypyc refuses,
  pip still succeeds, prints the one fallback line, and installs the
  pure-Python build: no extension at all, never some of them.

The copy holds the files git would commit now (tracked ones with their
uncommitted edits, plus new files that are not ignored), so a developer tests
the tree they have, without .venv, build/ or caches; under CI, a fresh clone,
that is exactly HEAD.  pip and build fetch setuptools, mypy and our four
dependencies through pip's cache.  All of it takes a few minutes, mostly
mypyc's C compiling twice (wheel and sdist), so these tests are marked
``install`` and run once per ``./dev test`` (tests/conftest.py).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

pytestmark = [pytest.mark.install, pytest.mark.slow, pytest.mark.timeout(1200)]

REPO = Path(__file__).resolve().parents[1]
FALLBACK = "swarmget: building the compiled extensions failed ("
PURE_FALLBACK = "); installing the pure-Python build"
DEMO_FILES = 200

# What a user's shell would not have: our dev setup's choice of build
# (./dev test puts the compiled build first on PYTHONPATH), the venv this
# process runs in, and compiler settings a test sets on purpose.
_NOT_A_USERS = (
    "PYTHONPATH",
    "PYTHONHOME",
    "VIRTUAL_ENV",
    "SWARMGET_PURE_PYTHON",
    "SWARMGET_EXPECT_BUILD",
    "CC",
    "LDSHARED",
    "PIP_NO_BUILD_ISOLATION",
    "PIP_REQUIRE_VIRTUALENV",
    "PIP_TARGET",
    "PIP_PREFIX",
    "PIP_USER",
)


def user_env(**extra: str) -> dict[str, str]:
    env = {key: value for key, value in os.environ.items() if key not in _NOT_A_USERS}
    env.update(extra)
    return env


def run(
    args: Sequence[str | Path], *, cwd: Path, env: dict[str, str] | None = None, timeout: float
) -> str:
    """Run a command; its stdout and stderr, interleaved.  A failure shows the output's end."""
    result = subprocess.run(
        [str(arg) for arg in args],
        cwd=cwd,
        env=env if env is not None else user_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=timeout,
        check=False,
    )
    if result.returncode != 0:
        tail = "\n".join(result.stdout.splitlines()[-60:])
        pytest.fail(f"{' '.join(map(str, args))} exited {result.returncode}:\n{tail}")
    return result.stdout


def copy_checkout(git: str, dest: Path) -> Path:
    """Copy the files git would commit now into ``dest`` (see the module docstring)."""
    listed = subprocess.run(
        [git, "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=REPO,
        capture_output=True,
        check=True,
    ).stdout
    for name in filter(None, listed.split(b"\0")):
        source = REPO / os.fsdecode(name)
        if not source.is_file():  # deleted in the work tree, not yet in git's index
            continue
        target = dest / os.fsdecode(name)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source, target)
    return dest


@dataclass(frozen=True)
class Venv:
    path: Path

    @classmethod
    def create(cls, path: Path) -> Venv:
        # The base interpreter's venv, as `python3 -m venv v` gives a user: pip and nothing else.
        run([sys.executable, "-m", "venv", path], cwd=path.parent, timeout=120)
        return cls(path)

    def bin(self, name: str) -> Path:
        return self.path / "bin" / name

    def pip_install(self, *args: str | Path, env: dict[str, str] | None = None) -> str:
        return run(
            [self.bin("python"), "-m", "pip", "install", *args], cwd=self.path, env=env, timeout=900
        )


@dataclass(frozen=True)
class Installed:
    """What an installed swarmget says about itself, asked from outside any checkout."""

    version: str
    compiled: bool
    location: str
    extensions: list[str]


_INSPECT = """
import importlib.machinery, os, swarmget
package = os.path.dirname(swarmget.__file__)
root = os.path.dirname(package)
ours = [os.path.join(d, n) for d, _, ns in os.walk(package) for n in ns]
ours += [os.path.join(root, n) for n in os.listdir(root) if "__mypyc" in n]
suffixes = tuple(importlib.machinery.EXTENSION_SUFFIXES)
print(swarmget.compiled())
print(package)
print(*sorted(os.path.relpath(p, root) for p in ours if p.endswith(suffixes)), sep="\\n")
"""


def inspect(venv: Venv, cwd: Path) -> Installed:
    version = run([venv.bin("swarmget"), "--version"], cwd=cwd, timeout=60).strip()
    compiled, location, *extensions = (
        run([venv.bin("python"), "-c", _INSPECT], cwd=cwd, timeout=60).strip().splitlines()
    )
    return Installed(version, compiled == "True", location, extensions)


def check_demo(venv: Venv, cwd: Path) -> None:
    output = run([venv.bin("swarmget"), "demo", "--files", str(DEMO_FILES)], cwd=cwd, timeout=300)
    assert f"{DEMO_FILES} files ok, 0 failed" in output, output
    assert "all good" in output, output


def check_compiled(venv: Venv, cwd: Path, build_output: str) -> None:
    installed = inspect(venv, cwd)
    assert installed.location.startswith(str(venv.path)), installed
    fallback = [line.strip() for line in build_output.splitlines() if FALLBACK in line]
    assert installed.compiled, f"pure-Python build installed: {fallback or installed}"
    assert installed.version.endswith("(compiled)"), installed.version
    # One shared library for all modules plus a shim per module: the shims need it.
    assert any("__mypyc" in name for name in installed.extensions), installed.extensions
    check_demo(venv, cwd)


def check_pure(venv: Venv, cwd: Path) -> None:
    installed = inspect(venv, cwd)
    assert installed.location.startswith(str(venv.path)), installed
    assert not installed.compiled, installed
    assert installed.version.endswith("(pure Python)"), installed.version
    assert installed.extensions == [], "a half-compiled install"
    check_demo(venv, cwd)


def fallback_lines(pip_output: str) -> list[str]:
    return [line.strip() for line in pip_output.splitlines() if FALLBACK in line]


@dataclass(frozen=True)
class Dists:
    wheel: Path
    sdist: Path
    output: str  # what building them printed


@pytest.fixture(scope="module")
def checkout(git_bin: str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return copy_checkout(git_bin, tmp_path_factory.mktemp("checkout"))


@pytest.fixture(scope="module")
def dists(checkout: Path, c_compiler: str, tmp_path_factory: pytest.TempPathFactory) -> Dists:
    out = tmp_path_factory.mktemp("dist")
    # No --sdist/--wheel: build makes the sdist, then the wheel from the unpacked sdist.
    output = run(
        [sys.executable, "-m", "build", "--outdir", out, checkout], cwd=checkout, timeout=900
    )
    (wheel,) = out.glob("swarmget-*.whl")
    (sdist,) = out.glob("swarmget-*.tar.gz")
    return Dists(wheel=wheel, sdist=sdist, output=output)


@pytest.fixture
def work(tmp_path: Path) -> Path:
    """A directory outside the checkout to run the installed commands in."""
    path = tmp_path / "work"
    path.mkdir()
    return path


def test_wheel_installs_the_compiled_build(dists: Dists, tmp_path: Path, work: Path) -> None:
    assert "-cp3" in dists.wheel.name, f"{dists.wheel.name} is not a compiled wheel"
    venv = Venv.create(tmp_path / "venv")
    venv.pip_install(dists.wheel)
    check_compiled(venv, work, dists.output)


def test_sdist_installs_the_compiled_build(dists: Dists, tmp_path: Path, work: Path) -> None:
    venv = Venv.create(tmp_path / "venv")
    # -v: pip shows the build's output, so a fallback line is there to report.
    output = venv.pip_install("-v", dists.sdist)
    check_compiled(venv, work, output)


def test_no_c_compiler_installs_the_pure_build(checkout: Path, tmp_path: Path, work: Path) -> None:
    tree = shutil.copytree(checkout, tmp_path / "tree")  # pip builds in the tree: keep ours clean
    venv = Venv.create(tmp_path / "venv")
    output = venv.pip_install("-v", tree, env=user_env(CC="/bin/false"))
    lines = fallback_lines(output)
    assert len(lines) == 1, lines or output[-3000:]
    assert "(no working C compiler: " in lines[0], lines[0]
    assert lines[0].endswith(PURE_FALLBACK), lines[0]
    check_pure(venv, work)


def test_type_error_installs_the_pure_build(checkout: Path, tmp_path: Path) -> None:
    # The original bug: mypyc's type check failed and so did `pip install`.
    tree = shutil.copytree(checkout, tmp_path / "tree")
    errors = tree / "src" / "swarmget" / "errors.py"
    with errors.open("a") as file:
        file.write('\n_BROKEN: int = "not an int"  # mypyc must refuse this module\n')
    target = tmp_path / "target"
    pip: list[str | Path] = [sys.executable, "-m", "pip", "install", "-v", "--no-deps"]
    lines = fallback_lines(run([*pip, "--target", target, tree], cwd=tmp_path, timeout=600))
    assert len(lines) == 1, lines
    assert "(mypyc: src/swarmget/errors.py:" in lines[0], lines[0]
    assert lines[0].endswith(PURE_FALLBACK), lines[0]
    extensions = list(target.rglob("*.so"))
    assert extensions == [], "a half-compiled install"


def test_the_datasets_extra_reads_parquet_lists(dists: Dists, tmp_path: Path, work: Path) -> None:
    # `pip install 'swarmget[datasets]'` from an empty venv brings pyarrow, and
    # the installed command reads a Parquet list with it (its rows here are no
    # URLs, so nothing needs a network: each fails alone as bad_url).
    venv = Venv.create(tmp_path / "venv")
    venv.pip_install(f"{dists.wheel}[datasets]")
    listing = work / "list.parquet"
    run(
        [venv.bin("python"), "-c",
         "import sys, pyarrow, pyarrow.parquet as pq; "
         "pq.write_table(pyarrow.table({'URL': ['not a url', 'ftp://x/y'], 'TEXT': ['a', 'b']}), "
         "sys.argv[1])", listing],
        cwd=work, timeout=120,
    )  # fmt: skip
    result = subprocess.run(
        [str(venv.bin("swarmget")), str(listing), "-o", str(work / "out"), "--json"],
        cwd=work, env=user_env(), capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 1, result.stderr  # rows failed; the list was read
    summary = json.loads(result.stdout)
    assert summary["total"] == 2 and summary["errors"] == {"bad_url": 2}, summary
