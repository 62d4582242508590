"""The import graph: packages import one way (suite → specs → workload → runner → Parquet →
reports, the application on top), no module imports itself round a cycle, and inside the
packages every import of our own code is relative, so the same files work from a clone and
installed under the ``kvbench`` namespace."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# Each room and the rooms it may import. A room is a top-level package, or one of the harness's
# subpackages; the harness's own top (its version, its errors, input files) is the room "harness".
# Everything else is a layer violation.
ALLOWED: dict[str, set[str]] = {
    "harness": set(),  # the version, the errors every layer raises, the safe reading of input files
    "harness.clock": {"harness"},  # step clocks: GPU presets, fitted terms, profiles, pricing, fitting
    "harness.spec": {"harness", "harness.clock"},  # what a run is: specs, geometry, capabilities, identity
    "harness.records": {"harness", "harness.spec"},  # what a run leaves on disk
    "harness.formats": {"harness", "harness.spec", "harness.records"},  # vLLM's result formats, read and written
    "harness.sim": {"harness", "harness.clock", "harness.spec", "harness.records"},  # kvbench's scheduler, policies
    "workloads": {"harness", "harness.spec", "harness.records"},
    "runners": {"harness", "harness.clock", "harness.spec", "harness.records", "harness.sim", "workloads"},
    # reports read records and specs; they never run anything, so never the simulator
    "reports": {"harness", "harness.clock", "harness.spec", "harness.records", "harness.formats"},
    "app": {
        "harness",
        "harness.clock",
        "harness.spec",
        "harness.records",
        "harness.formats",
        "harness.sim",
        "workloads",
        "runners",
        "reports",
        "suites",
    },
    "suites": set(),
}
PACKAGES = ("harness", "workloads", "runners", "reports", "app", "suites")


def room(module: str) -> str:
    parts = module.split(".")
    if parts[0] == "harness" and len(parts) > 1 and f"harness.{parts[1]}" in ALLOWED:
        return f"harness.{parts[1]}"
    return parts[0]


def modules() -> dict[str, Path]:
    out = {}
    for pkg in PACKAGES:
        for p in (ROOT / pkg).rglob("*.py"):
            parts = list(p.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join(parts)] = p
    return out


def imports(mods: dict[str, Path]) -> tuple[dict[str, set[str]], list[str]]:
    """Module → the modules of ours it imports (function-local imports too), and the absolute
    imports of our own packages found inside them (which would break once installed)."""
    edges: dict[str, set[str]] = {m: set() for m in mods}
    absolute: list[str] = []

    def resolve(name: str) -> str | None:
        while name and name not in mods:
            name = name.rpartition(".")[0]
        return name or None

    for m, p in mods.items():
        package = m.split(".") if p.name == "__init__.py" else m.split(".")[:-1]
        for node in ast.walk(ast.parse(p.read_text(encoding="utf-8"))):
            names: list[str] = []
            if isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package[: len(package) - (node.level - 1)]
                    prefix = ".".join(base + ([node.module] if node.module else []))
                else:
                    prefix = node.module or ""
                    if prefix.split(".")[0] in (*PACKAGES, "kvbench"):
                        absolute.append(f"{m}: from {prefix} import ...")
                names = [prefix] + [f"{prefix}.{a.name}" if prefix else a.name for a in node.names]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
                absolute += [f"{m}: import {n}" for n in names if n.split(".")[0] in (*PACKAGES, "kvbench")]
            for n in names:
                target = resolve(n)
                if target and target != m and not m.startswith(target + "."):
                    edges[m].add(target)
    return edges, absolute


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    counter = [0]
    sys.setrecursionlimit(max(10000, sys.getrecursionlimit()))

    def strong(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in graph:
        if v not in index:
            strong(v)
    return out


@pytest.fixture(scope="module")
def graph() -> tuple[dict[str, set[str]], list[str]]:
    return imports(modules())


def climbing(edges: dict[str, set[str]]) -> list[str]:
    return sorted(
        f"{a} -> {b}" for a, bs in edges.items() for b in bs if room(b) != room(a) and room(b) not in ALLOWED[room(a)]
    )


def test_packages_import_only_down(graph: tuple[dict[str, set[str]], list[str]]) -> None:
    edges, _ = graph
    wrong = climbing(edges)
    assert not wrong, "imports against the layers:\n" + "\n".join(wrong)


def test_every_module_is_in_a_room(graph: tuple[dict[str, set[str]], list[str]]) -> None:
    edges, _ = graph
    assert {room(m) for m in edges} <= set(ALLOWED)
    # The harness's top holds only its version, its errors and the reading of input files: the rest is in rooms.
    assert sorted(m for m in edges if room(m) == "harness") == ["harness", "harness.errors", "harness.files"]


def test_no_module_cycle(graph: tuple[dict[str, set[str]], list[str]]) -> None:
    edges, _ = graph
    assert cycles(edges) == []


def test_own_imports_are_relative(graph: tuple[dict[str, set[str]], list[str]]) -> None:
    _, absolute = graph
    assert not absolute, "absolute imports of our own packages (use relative ones):\n" + "\n".join(absolute)


def test_the_checker_sees_a_cycle_and_a_climb() -> None:
    # The checks above must be able to fail: a climbing import and a two-module cycle are caught.
    assert cycles({"a.x": {"a.y"}, "a.y": {"a.x"}, "a.z": set()}) == [["a.x", "a.y"]]
    assert climbing({"harness.spec.specs": {"reports.tables"}})
    assert climbing({"reports.prediction": {"harness.sim.scheduler"}})  # reports never see the simulator
    assert climbing({"harness.clock.fit": {"harness.spec.specs"}})  # the clocks sit below the specs
    assert climbing({"harness.spec.specs": {"harness.records.store"}})
    assert not climbing({"reports.prediction": {"harness.clock.fit", "harness.records.store"}})


def test_registries_agree_with_capabilities() -> None:
    # Importing the registries runs their agreement checks against harness/spec/capabilities.py.
    from kvbench.harness.sim.policies import POLICIES
    from kvbench.harness.spec import capabilities
    from kvbench.runners import RUNNERS

    assert tuple(POLICIES) == capabilities.POLICIES
    assert tuple(RUNNERS) == capabilities.RUNNER_NAMES
    for runner in capabilities.RUNNER_FACTS.values():
        assert set(runner.policies) <= set(capabilities.POLICIES)
