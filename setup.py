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
test servers.

``SWARMGET_PURE_PYTHON=1`` builds without compiling (``./dev`` uses it for the
editable install, so an edited ``.py`` takes effect at once); so does a
machine without mypy or a C compiler: every extension is optional and the
package works the same from its ``.py`` files, only slower.
"""

from __future__ import annotations

import os

from setuptools import setup
from setuptools.command.build_ext import build_ext

COMPILED = [
    "src/swarmget/api.py",
    "src/swarmget/errors.py",
    "src/swarmget/manifest.py",
    "src/swarmget/report.py",
    "src/swarmget/engine/connection.py",
    "src/swarmget/engine/core.py",
    "src/swarmget/engine/https.py",
    "src/swarmget/engine/job.py",
    "src/swarmget/engine/pool.py",
    "src/swarmget/engine/redirects.py",
    "src/swarmget/engine/retry.py",
    "src/swarmget/engine/tunnel.py",
    "src/swarmget/loop/core.py",
    "src/swarmget/net/tls.py",
    "src/swarmget/parallel/supervisor.py",
    "src/swarmget/parallel/worker.py",
    "src/swarmget/protocol/http11.py",
    "src/swarmget/sinks/base.py",
    "src/swarmget/sinks/files.py",
    "src/swarmget/sinks/naming.py",
    "src/swarmget/sinks/plan.py",
    "src/swarmget/sources/fields.py",
    "src/swarmget/sources/formats.py",
    "src/swarmget/sources/reader.py",
    "src/swarmget/sources/rows.py",
]


class ParallelBuildExt(build_ext):
    """Compile the generated C files on every core, and never fail the install."""

    def finalize_options(self) -> None:
        super().finalize_options()
        if not self.parallel:
            self.parallel = os.cpu_count() or 1


def compiled_extensions() -> list:  # type: ignore[type-arg]
    if os.environ.get("SWARMGET_PURE_PYTHON", "") not in ("", "0"):
        return []
    try:
        from mypyc.build import mypycify
    except ImportError:
        print("swarmget: mypyc not available, installing the pure-Python package")
        return []
    extensions = mypycify(COMPILED, opt_level="3")
    for extension in extensions:
        extension.optional = True  # no C compiler: fall back to the .py files
    return extensions


setup(ext_modules=compiled_extensions(), cmdclass={"build_ext": ParallelBuildExt})
