"""Fixtures shared by every test module.

- ``nginx_bin``: path of the nginx binary.  Skips when nginx is missing on a
  developer's machine, but *fails* under CI (``CI`` set), where `.ci/run`
  installs it and a silent skip would hide a broken setup.
- ``nginx_server`` (session): a real nginx serving ``TREE_COUNT`` files of
  ``TREE_SIZE`` bytes made by :func:`swarmget.testing.nginx.make_tree`.  It is a
  :class:`~swarmget.testing.nginx.ServedTree`: ``.url(name)``, ``.base_url``,
  ``.port``, ``.names``, ``.size``, ``.urls()``, ``.expected(name)`` (the
  bytes a correct download of ``name`` must have), ``.root``, ``.nginx``.
- ``tls_files`` (session): a throwaway CA and a server certificate for
  127.0.0.1/localhost (:class:`~swarmget.testing.nginx.TlsFiles`: ``.ca_pem``...).
- ``nginx_tls_server`` (session): the same tree as ``nginx_server``, served
  over HTTPS with the ``tls_files`` certificate (pass ``cacert=tls_files.ca_pem``).
- ``tinyproxy_bin``: path of Debian's tinyproxy (an http proxy for
  tests/test_proxy.py); skips when missing, fails under CI, like ``nginx_bin``.
- ``out_dir``: a fresh empty directory per test, on tmpfs (/dev/shm) when
  there is room, because disk speed is not what our tests measure.
- ``c_compiler``: the C compiler mypyc's build uses, checked to find
  ``Python.h``; skips when there is none, fails under CI, like ``nginx_bin``.
- ``git_bin``: path of git; skips when missing, fails under CI.

Tests marked ``install`` (tests/test_install.py) build and install their own
copies of the package, so the build this process imports does not matter to
them: they run in the compiled pass of ``./dev test`` and skip in the pure one
(``SWARMGET_EXPECT_BUILD=pure``), where they would only repeat.
"""

from __future__ import annotations

import contextlib
import os
import resource
import shlex
import shutil
import signal
import subprocess
import sysconfig
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import settings

from swarmget.testing.nginx import (
    Nginx,
    ServedTree,
    TlsFiles,
    find_nginx,
    make_tls_files,
    make_tree,
)

# A shell that starts a job in the background without job control (`cmd &` in
# a script) starts it with SIGINT ignored, and an ignored signal stays ignored
# through exec: every swarmget the tests start would then shrug off the Ctrl-C
# the tests send it.  A handler of our own is reset to the default at exec.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)
from swarmget.testing.tinyproxy import find_tinyproxy

# CI must not turn red by chance: there the property tests draw the same examples
# every run.  A developer's runs stay random and keep finding new cases; each one
# found becomes a test of its own (test_sources.py has some).
settings.register_profile("ci", derandomize=True)
if os.environ.get("CI"):
    settings.load_profile("ci")

TREE_COUNT = 2500
TREE_SIZE = 50 * 1024

_SHM = "/dev/shm"
_SHM_MIN_FREE = 1 << 30


def pytest_configure(config: pytest.Config) -> None:
    _raise_nofile_limit()
    if os.environ.get("SWARMGET_EXPECT_BUILD") == "compiled":
        # setup.py never fails an install: a module mypyc cannot compile makes the
        # whole build pure Python, and the compiled pass would test the .py files.
        import swarmget

        if not swarmget.compiled():
            raise pytest.UsageError(
                "SWARMGET_EXPECT_BUILD=compiled, but swarmget runs from .py files "
                f"({swarmget.__file__}): the mypyc build fell back (pip install -v . says why)"
            )


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # Anything that uses the shared server needs nginx: mark it so `-m "not nginx"` works.
    for item in items:
        if {"nginx_server", "nginx_bin"} & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.nginx)
    if os.environ.get("SWARMGET_EXPECT_BUILD") == "pure":
        # The install tests install their own builds: once per `./dev test` is enough.
        # A skip, not a deselection: `./dev test -m install` deselecting all would be
        # pytest's exit 5, which ./dev counts as a failed pass ("no tests ran").
        once = pytest.mark.skip(reason="install tests run in ./dev test's compiled pass only")
        for item in items:
            if item.get_closest_marker("install"):
                item.add_marker(once)


def _raise_nofile_limit() -> None:
    """Soft RLIMIT_NOFILE up to the hard limit: tests open thousands of sockets."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard if hard != resource.RLIM_INFINITY else 1 << 20
    if soft != resource.RLIM_INFINITY and soft < target:
        with contextlib.suppress(OSError, ValueError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))


def under_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


def _fast_tmp_base() -> str | None:
    """/dev/shm when it exists, is writable and has room; else None (the default tmp)."""
    try:
        stat = os.statvfs(_SHM)
    except OSError:
        return None
    if not os.access(_SHM, os.W_OK) or stat.f_bavail * stat.f_frsize < _SHM_MIN_FREE:
        return None
    return _SHM


def _required(binary: str | None, name: str, package: str) -> str:
    """The program's path; a skip on a developer's machine without it, a failure under CI."""
    if binary is None:
        reason = f"{name} is not installed (`./dev test` installs it: apt-get install {package})"
        if under_ci():
            pytest.fail(f"{reason}; under CI it is required, not skipped", pytrace=False)
        pytest.skip(reason)
    return binary


@pytest.fixture(scope="session")
def nginx_bin() -> str:
    return _required(find_nginx(), "nginx", "nginx-light")


@pytest.fixture(scope="session")
def tinyproxy_bin() -> str:
    return _required(find_tinyproxy(), "tinyproxy", "tinyproxy")


def find_c_compiler() -> str | None:
    """The compiler setuptools would use (``$CC``, else Python's own), if it finds Python.h."""
    command = shlex.split(os.environ.get("CC") or sysconfig.get_config_var("CC") or "cc")
    if not command or shutil.which(command[0]) is None:
        return None
    include = sysconfig.get_paths()["include"]
    probe = subprocess.run(
        [*command, f"-I{include}", "-fsyntax-only", "-x", "c", "-"],
        input=b"#include <Python.h>\n",
        capture_output=True,
        check=False,
    )
    return shutil.which(command[0]) if probe.returncode == 0 else None


@pytest.fixture(scope="session")
def c_compiler() -> str:
    return _required(
        find_c_compiler(), "a C compiler that finds Python.h", "gcc libc6-dev python3-dev"
    )


@pytest.fixture(scope="session")
def git_bin() -> str:
    return _required(shutil.which("git"), "git", "git")


@pytest.fixture(scope="session")
def nginx_server(nginx_bin: str) -> Iterator[ServedTree]:
    root = Path(tempfile.mkdtemp(prefix="swarmget-www-", dir=_fast_tmp_base()))
    try:
        names = make_tree(root, TREE_COUNT, TREE_SIZE)
        with Nginx(root) as nginx:
            yield ServedTree(nginx=nginx, root=root, names=names, size=TREE_SIZE)
    finally:
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="session")
def tls_files(tmp_path_factory: pytest.TempPathFactory) -> TlsFiles:
    return make_tls_files(tmp_path_factory.mktemp("tls"))


@pytest.fixture(scope="session")
def nginx_tls_server(nginx_server: ServedTree, tls_files: TlsFiles) -> Iterator[ServedTree]:
    # The same files as nginx_server, over HTTPS: no second tree to write.
    with Nginx(nginx_server.root, ssl=tls_files.server) as nginx:
        yield ServedTree(
            nginx=nginx, root=nginx_server.root, names=nginx_server.names, size=nginx_server.size
        )


@pytest.fixture
def out_dir(tmp_path: Path) -> Iterator[Path]:
    base = _fast_tmp_base()
    if base is None:
        yield tmp_path
        return
    path = Path(tempfile.mkdtemp(prefix="swarmget-out-", dir=base))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="session")
def nxdomain_dns() -> Iterator[str]:
    """A name server on loopback that answers NXDOMAIN to everything.

    Tests that need a name to fail use it (``dns_servers=(nxdomain_dns,)``)
    rather than the machine's resolver, so no test sends DNS off this host.
    """
    from swarmget.testing.dns import nxdomain_server

    with nxdomain_server() as (address, _):
        yield address
