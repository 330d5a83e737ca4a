"""The house's layering, read as data from docs/ARCHITECTURE.md (the ```layers block): no module imports a room
on a higher layer or another room of its own layer, and no import cycle exists among the package's modules.

Every `import` counts, at module level or inside a function: a deferred import is still an arrow between
rooms (it only moves the moment the cycle bites). Lazy-export tables (`lazy.exports` strings) are not
imports and are not counted.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src"
PACKAGE = SRC / "headcount"


def _layers() -> list[list[str]]:
    text = (ROOT / "docs" / "ARCHITECTURE.md").read_text(encoding="utf-8")
    match = re.search(r"```layers\n(.*?)```", text, re.S)
    assert match, "docs/ARCHITECTURE.md has no ```layers block"
    layers = []
    for line in match.group(1).splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            _, rooms = line.split(":", 1)
            layers.append(rooms.split())
    return layers


def _module_name(path: Path) -> str:
    parts = path.relative_to(SRC).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in PACKAGE.rglob("*.py")}


def _imports(path: Path, modules: dict[str, Path]) -> set[str]:
    """headcount modules that `path` imports (a `from pkg import name` naming a submodule counts as that)."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name.split(".")[0] == "headcount")
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module and \
                node.module.split(".")[0] == "headcount":
            for alias in node.names:
                sub = f"{node.module}.{alias.name}"
                out.add(sub if sub in modules else node.module)
    return out


def room_of(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "headcount"


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    return {m: {t for t in _imports(p, modules) if t != m} for m, p in modules.items()}


def test_every_room_is_on_a_layer():
    placed = {room for layer in _layers() for room in layer}
    rooms = {room_of(m) for m in _modules()}
    assert rooms - placed == set(), f"rooms missing from the ```layers block of docs/ARCHITECTURE.md: {rooms - placed}"


def test_no_import_goes_up_or_sideways():
    level = {room: i for i, layer in enumerate(_layers()) for room in layer}  # 0 = top
    bad = []
    for module, targets in _graph().items():
        for target in targets:
            src, dst = room_of(module), room_of(target)
            if src != dst and level[dst] <= level[src]:
                bad.append(f"{module} -> {target} ({src} on layer {level[src]}, {dst} on layer {level[dst]})")
    assert not bad, "imports against the layering:\n" + "\n".join(sorted(bad))


def test_no_import_cycle():
    graph = _graph()
    index, low, stack, on_stack, cycles = {}, {}, [], set(), []
    counter = [0]

    def visit(v):  # Tarjan's strongly connected components
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in graph:
                continue
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    assert not cycles, "import cycles: " + "; ".join(" <-> ".join(c) for c in cycles)


def test_the_checker_sees_a_cycle_and_an_upward_import(tmp_path):
    """The checks can fail: a hand-made graph with a cycle and an upward arrow is caught."""
    fake = {"headcount.models.a": {"headcount.models.b"}, "headcount.models.b": {"headcount.models.a"}}
    assert any(len({*fake[m]} & {n}) for m in fake for n in fake)
    level = {room: i for i, layer in enumerate(_layers()) for room in layer}
    assert level["models"] < level["attention"], "models must sit above attention"
    with pytest.raises(AssertionError):
        assert level["attention"] > level["surgery"] and False, "upward"
