"""Build hook: compile the hot path to C with mypyc (the rest stays plain Python).

Per file, the event loop, the HTTP layer, the file sink and the manifest run a
few dozen Python statements; with the kernel's share fixed, that interpreter
time is the part of our CPU per file we can cut.  mypyc turns these already
strictly typed modules into C extensions, with no second source to maintain:
on the nginx benchmark it removes about 40% of our user-space instructions
(README.md, "Speed", has the figures).

What is compiled is the list below: modules that run per file or per read.
Not compiled, on purpose: the public ``Options`` (mypyc would enforce its
annotations at run time, so a list where a tuple is declared would be a
TypeError for API callers), DNS and connection setup (per host, not per file,
and driven by pycares callbacks), the CLI, demo and progress display, and the
test servers.  Classes and the list go together: a compiled class's bases
must be compiled too (mypyc crashes on ``PartFile(Writer)`` otherwise), and a
class in a module left out cannot subclass a compiled one (``TypeError:
interpreted classes cannot inherit from compiled`` at import), so a module
whose classes subclass or are subclassed across that line goes in with them.

An install never fails because of this step: the package works the same from
its ``.py`` files, only slower, so whenever compiling cannot be done the build
prints one line starting ``swarmget: building the compiled extensions failed``
(pip shows it with ``-v``) and installs the pure-Python build.  That covers
mypy or mypyc missing or failing, no working C compiler (or no ``Python.h``),
and any one extension failing to compile or link.  It is all or nothing:
mypyc makes one shared library plus a small shim per module, and a shim whose
library is missing would make ``import swarmget`` fail, so either every
extension is installed or none is.  ``swarmget --version`` says which build
was installed.  ``SWARMGET_PURE_PYTHON=1`` builds the pure one on purpose
(``./dev`` does, for the editable install, so an edited ``.py`` takes effect
at once).

mypyc type-checks what it compiles, but that check is not our strict mypy run
(``./dev test`` does that): pip builds in an isolated environment without our
dependencies, where the strict configuration in pyproject.toml fails on things
that only hold with them installed (an ignore that becomes unused, an import
that cannot be followed).  So the build ignores pyproject's [tool.mypy] and
checks with mypy's defaults plus ``--ignore-missing-imports``: the result does
not depend on what else happens to be installed in the build environment.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import sys
import tempfile
from importlib.machinery import EXTENSION_SUFFIXES
from typing import Any

from setuptools import Distribution, setup
from setuptools.command.build_ext import build_ext

COMPILED = [
    "src/swarmget/api.py",
    "src/swarmget/errors.py",
    "src/swarmget/manifest.py",
    "src/swarmget/report.py",
    "src/swarmget/engine/classify.py",
    "src/swarmget/engine/connection.py",
    "src/swarmget/engine/core.py",
    "src/swarmget/engine/events.py",
    "src/swarmget/engine/https.py",
    "src/swarmget/engine/job.py",
    "src/swarmget/engine/owner.py",
    "src/swarmget/engine/pool.py",
    "src/swarmget/engine/redirects.py",
    "src/swarmget/engine/retry.py",
    "src/swarmget/engine/scheduler.py",
    "src/swarmget/engine/tunnel.py",
    "src/swarmget/engine/urls.py",
    "src/swarmget/engine/verdicts.py",
    "src/swarmget/loop/core.py",
    "src/swarmget/net/tls.py",
    "src/swarmget/parallel/backend.py",
    "src/swarmget/parallel/inline.py",
    "src/swarmget/parallel/supervisor.py",
    "src/swarmget/parallel/worker.py",
    "src/swarmget/protocol/http11.py",
    "src/swarmget/protocol/request.py",
    "src/swarmget/sinks/base.py",
    "src/swarmget/sinks/bloom.py",
    "src/swarmget/sinks/files.py",
    "src/swarmget/sinks/journal.py",
    "src/swarmget/sinks/manifest_lines.py",
    "src/swarmget/sinks/memory.py",
    "src/swarmget/sinks/naming.py",
    "src/swarmget/sinks/plan.py",
    "src/swarmget/sources/fields.py",
    "src/swarmget/sources/formats.py",
    "src/swarmget/sources/reader.py",
    "src/swarmget/sources/rows.py",
    "src/swarmget/streaming/delivery.py",
]

# mypy flags for the build's type check (see the module docstring): no config
# file, mypy's default strictness, third-party modules without types are Any.
MYPYC_FLAGS = ["--config-file=", "--ignore-missing-imports", "--no-warn-unused-ignores"]

# Commands that only write metadata or an sdist: no C code needed.  pip runs
# setup.py once per build hook (requirements, metadata, wheel), and type-checking
# and generating C in each would triple the build's time.
BUILDS_NOTHING = frozenset({"clean", "dist_info", "egg_info", "sdist"})

FALLBACK = (
    "swarmget: building the compiled extensions failed ({}); installing the pure-Python build"
)


def fall_back(reason: str) -> None:
    """The one line that says the install goes on without the compiled build, and why."""
    print(FALLBACK.format(reason), file=sys.stderr, flush=True)


def mypyc_extensions() -> list[Any]:
    """mypyc's extensions for COMPILED, or [] (after fall_back()) when mypyc fails."""
    if os.environ.get("SWARMGET_PURE_PYTHON", "") not in ("", "0"):
        return []
    try:
        from mypyc.build import mypycify
    except ImportError as error:
        fall_back(f"mypyc is not installed: {error}")
        return []
    # mypyc prints type errors and exits; keep its output to name the first error.
    output = io.StringIO()
    try:
        with contextlib.redirect_stdout(output), contextlib.redirect_stderr(output):
            extensions: list[Any] = mypycify([*MYPYC_FLAGS, *COMPILED], opt_level="3")
    except (Exception, SystemExit) as error:  # SystemExit: mypy's and mypyc's way to fail
        fall_back(f"mypyc: {_first_error(output.getvalue(), error)}")
        return []
    sys.stdout.write(output.getvalue())
    return extensions


def _first_error(output: str, error: BaseException) -> str:
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    errors = [line for line in lines if "error:" in line]
    if errors:
        more = f" and {len(errors) - 1} more" if len(errors) > 1 else ""
        return errors[0] + more
    if isinstance(error, SystemExit) and isinstance(error.code, str):
        return error.code
    if lines:
        return lines[-1]
    return f"{type(error).__name__}: {error}"


def _describe(error: Exception) -> str:
    # A failed compiler command's exception repeats its whole command line; the
    # compiler's own messages are in the build output already, above our line.
    status = re.search(r"exit status -?\d+", str(error))
    return status.group(0) if status else f"{type(error).__name__}: {error}"


class SwarmgetDistribution(Distribution):
    """Runs mypyc once it knows the commands, and only for a command that builds."""

    def run_commands(self) -> None:
        if not set(self.commands) <= BUILDS_NOTHING:
            self.ext_modules = mypyc_extensions()
        super().run_commands()


class AllOrNothingBuildExt(build_ext):
    """Compile every extension on every core, or install none of them."""

    def finalize_options(self) -> None:
        super().finalize_options()
        if not self.parallel:
            self.parallel = os.cpu_count() or 1

    def build_extensions(self) -> None:
        # Stale extensions from an earlier build in this tree (a module since
        # dropped from COMPILED, or all of them before a fallback) would be
        # installed with the rest of build_lib: remove what this build won't make.
        self._remove_extension_files(keep=self._outputs())
        problem = self._compiler_problem()
        if problem is None:
            try:
                super().build_extensions()
                return
            except Exception as error:  # any one module failing: a half build is no build
                problem = f"compiling mypyc's C code failed, {_describe(error)}"
        fall_back(problem)
        self._remove_extension_files(keep=set())
        self.extensions = []  # so get_outputs() lists no extension either

    def _compiler_problem(self) -> str | None:
        """None when the compiler builds a Python extension; else what went wrong.

        Tried once, on a few lines, before the minute of compiling mypyc's C:
        so no compiler, or no Python.h, takes a second to find out.
        """
        with tempfile.TemporaryDirectory(prefix="swarmget-cc-") as tmp:
            source = os.path.join(tmp, "probe.c")
            with open(source, "w") as file:
                file.write("#include <Python.h>\nint swarmget_probe(void) { return 0; }\n")
            try:
                objects = self.compiler.compile([source], output_dir=tmp)
                self.compiler.link_shared_object(objects, os.path.join(tmp, "probe.so"))
            except Exception as error:
                compiler = (getattr(self.compiler, "compiler_so", None) or ["cc"])[0]
                return (
                    f"no working C compiler: {compiler} cannot build a test extension, "
                    + _describe(error)
                )
        return None

    def _outputs(self) -> set[str]:
        return {os.path.abspath(self.get_ext_fullpath(ext.name)) for ext in self.extensions}

    def _remove_extension_files(self, keep: set[str]) -> None:
        for directory, _, names in os.walk(self.build_lib):
            for name in names:
                path = os.path.abspath(os.path.join(directory, name))
                if name.endswith(tuple(EXTENSION_SUFFIXES)) and path not in keep:
                    os.remove(path)


setup(
    distclass=SwarmgetDistribution,
    cmdclass={"build_ext": AllOrNothingBuildExt},
)
