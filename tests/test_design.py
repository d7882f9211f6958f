"""Properties of the code's shape that the design relies on (docs/ARCHITECTURE.md)."""

from __future__ import annotations

import ast
import importlib
import pickle
import pkgutil
import subprocess
import sys
from pathlib import Path

import pytest

import swarmget
from swarmget.errors import SwarmgetError, TransferError
from swarmget.report import FileResult, Report

SRC = Path(swarmget.__file__).resolve().parent
# Modules that import optional packages at their top: not imported by the
# error walk below (their errors, if any, still come from swarmget.errors).
OPTIONAL = {"swarmget.net.ares"}


def _imports(path: Path, package: str) -> set[str]:
    """swarmget modules that ``path`` imports, anywhere but under ``if TYPE_CHECKING``."""
    tree = ast.parse(path.read_text())
    skipped: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skipped.update(id(child) for stmt in node.body for child in ast.walk(stmt))
    found: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith(package):
            found.add(node.module)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith(package))
    return found


def _module_graph(packages: list[str]) -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for package in packages:
        folder = SRC / package.split(".", 1)[1]
        for path in folder.glob("*.py"):
            name = f"{package}.{path.stem}" if path.stem != "__init__" else package
            graph[name] = {m for m in _imports(path, "swarmget") if m.startswith(tuple(packages))}
    return graph


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for target in sorted(graph.get(node, ())):
            if state.get(target) == 1:
                return [*stack[stack.index(target) :], target]
            if state.get(target) is None and (found := visit(target)):
                return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


@pytest.mark.parametrize("packages", [["swarmget.engine"], ["swarmget.net"]])
def test_no_import_cycles(packages: list[str]) -> None:
    graph = _module_graph(packages)
    assert graph, packages
    assert _cycle(graph) is None, " -> ".join(_cycle(graph) or [])


def test_the_cycle_finder_finds_cycles() -> None:
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None


def test_the_engine_talks_to_sinks_only_through_their_interface() -> None:
    # The engine may build the file sink's errors (OutputError) but never a path.
    for path in (SRC / "engine").glob("*.py"):
        imported = _imports(path, "swarmget.sinks")
        assert imported <= {"swarmget.sinks.base", "swarmget.sinks.files"}, path.name
        text = path.read_text()
        assert "PartFile" not in text and "FileSink(" not in text, path.name


def test_connections_never_import_the_engine() -> None:
    for name in ("connection", "https", "tunnel"):
        assert "swarmget.engine.core" not in _imports(SRC / "engine" / f"{name}.py", "swarmget")


def test_no_function_in_the_engine_is_over_60_lines() -> None:
    long = []
    for path in (SRC / "engine").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                length = (node.end_lineno or node.lineno) - node.lineno + 1
                if length > 60:
                    long.append(f"{path.name}:{node.name} ({length} lines)")
    assert long == []


def _all_errors() -> list[type[SwarmgetError]]:
    for info in pkgutil.walk_packages(swarmget.__path__, "swarmget."):
        skip = info.name in OPTIONAL or info.name.endswith("__main__")
        if not skip and not info.name.startswith("swarmget.testing"):
            importlib.import_module(info.name)
    seen: list[type[SwarmgetError]] = []
    todo: list[type[SwarmgetError]] = [SwarmgetError]
    while todo:
        cls = todo.pop()
        seen.append(cls)
        todo.extend(cls.__subclasses__())
    return seen


def _example(cls: type[SwarmgetError]) -> SwarmgetError:
    """An instance of ``cls``; compiled classes have no signature to read, so try."""
    for args in (("timeout", "what went wrong"), ("what went wrong",)):
        try:
            return cls(*args)
        except TypeError:
            continue
    raise AssertionError(f"cannot make a {cls.__name__}")


def test_every_error_pickles_with_its_code_and_message() -> None:
    errors = _all_errors()
    assert len(errors) >= 6, errors
    for cls in errors:
        error = _example(cls)
        copy = pickle.loads(pickle.dumps(error))
        assert type(copy) is cls
        assert copy.args == error.args, cls
        assert str(copy) == str(error), cls
        assert copy.code == error.code, cls
        if isinstance(error, TransferError):
            assert isinstance(copy, TransferError) and copy.message == error.message, cls


def test_every_error_pickles_with_what_was_set_on_it_since() -> None:
    # The report a stopped run attaches (and a note) were lost by every class
    # with a __reduce__ of its own: a caller that sends the error to another
    # process (multiprocessing, a job queue) lost the outcome of every row.
    failure = FileResult("http://h/a", None, "failed", error="http_404", index=1)
    for cls in _all_errors():
        error = _example(cls)
        error.report = Report(ok=2, failed=1, failures=[failure], manifest="m.jsonl")
        error.add_note("a note")
        copy = pickle.loads(pickle.dumps(error))
        assert type(copy) is cls and str(copy) == str(error), cls
        assert copy.report is not None, cls
        assert (copy.report.ok, copy.report.failures, copy.report.manifest) == (
            2, [failure], "m.jsonl"
        ), cls  # fmt: skip
        assert copy.__notes__ == ["a note"], cls
        assert pickle.loads(pickle.dumps(_example(cls))).report is None, cls


def test_an_error_made_without_a_message_prints_its_code() -> None:
    # In a process of its own: compiled, str(UsageError()) was a segfault.
    script = (
        "import swarmget\n"
        "print(str(swarmget.SwarmgetError()), str(swarmget.UsageError()))\n"
        "raise swarmget.UsageError()\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=30, check=False
    )
    assert done.returncode == 1, done
    assert done.stdout == "error usage\n"
    assert done.stderr.rstrip().endswith("swarmget.errors.UsageError: usage")


def test_a_file_result_pickles_with_every_field_in_its_place() -> None:
    # Workers report rows as pickled FileResults; a field that came back in
    # another's place would be recorded wrong, silently.
    from swarmget.report import _FIELDS, FileResult

    values = {
        "url": "http://h/u", "path": "p", "status": "ok", "http_status": 201, "bytes": 2,
        "error": "e", "attempts": 3, "elapsed_ms": 4, "message": "m",
        "digests": {"sha256": "d"}, "final_url": "http://h/f", "index": 5, "key": 6,
        "payload": b"body", "reused": 7,
    }  # fmt: skip
    assert sorted(values) == sorted(_FIELDS)
    result = FileResult(**values)
    copy = pickle.loads(pickle.dumps(result))
    assert type(copy) is FileResult
    assert {name: getattr(copy, name) for name in _FIELDS} == values
