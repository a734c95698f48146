"""The package's layering, read from the source (no imports, no MPI).

``docs/architecture.md`` draws disttensor as layers in import order; these tests hold the
tree to that drawing: each layer imports at module level only from the layers below it (an
import inside a function body is allowed: the foundation's ``DistArray`` methods reach up to
the front lazily), the foundation ``disttensor/core`` has no import cycle among its modules,
no module grows past ~600 lines, and at most a dozen modules sit directly in ``disttensor/``.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[2] / "disttensor"

# layer -> the layers its modules may import at module level (besides their own).  The front:
# `routines` (NumPy's manual sections) under `linalg`, `fft` and `random` (NumPy's subpackages)
LAYERS = {
    "core": set(),
    "routines": {"core"},
    "linalg": {"core", "routines"},
    "fft": {"core", "routines"},
    "random": {"core", "routines"},
    "array_api": {"core", "routines", "linalg", "fft", "random"},
    "ops": {"core", "routines", "random"},
    "autograd": {"core", "routines", "random", "ops"},
    "io": {"core", "routines"},
    "sparse": {"core", "routines", "io"},
    "nn": {"core", "routines", "random", "ops", "autograd", "io", "sparse"},
    "train": {"core", "routines", "random", "ops", "autograd", "io", "nn", "sparse"},
    "plan": {"core", "routines", "random", "ops", "autograd", "io", "nn", "sparse"},
    "predict": {"core", "routines", "random", "ops", "autograd", "io", "nn", "sparse", "train"},
    "info": {"core", "ops"},
    "warmup": set(),  # stdlib only at module level: the library is imported when it warms
    "testing": {"core", "routines"},
}
LAYERS[""] = set(LAYERS)  # disttensor/__init__.py gathers the public names of all

# modules allowed past the size limit, with the reason (kept short on purpose)
SIZE_LIMIT = 600
OVERSIZE = {}


def _modules():
    for path in sorted(PKG.rglob("*.py")):
        rel = path.relative_to(PKG.parent).with_suffix("")
        parts = list(rel.parts)
        is_pkg = parts[-1] == "__init__"
        if is_pkg:
            parts = parts[:-1]
        yield ".".join(parts), path, is_pkg


MODULES = {name: (path, is_pkg) for name, path, is_pkg in _modules()}


def _layer(mod: str) -> str:
    parts = mod.split(".")
    return parts[1] if len(parts) > 1 else ""


def _resolve(mod: str, is_pkg: bool, node: ast.ImportFrom) -> list[str]:
    """Absolute disttensor module names an ``ImportFrom`` at module level loads."""
    if node.level == 0:
        base = node.module or ""
    else:
        pkg = mod.split(".") if is_pkg else mod.split(".")[:-1]
        pkg = pkg[: len(pkg) - (node.level - 1)]
        base = ".".join(pkg + ([node.module] if node.module else []))
    if not base.startswith("disttensor"):
        return []
    out = [base]
    for alias in node.names:  # `from . import x` loads submodule x
        sub = f"{base}.{alias.name}"
        if sub in MODULES:
            out.append(sub)
    return out


def _toplevel_imports(mod: str, path: Path, is_pkg: bool) -> set[str]:
    tree = ast.parse(path.read_text(), str(path))
    found: set[str] = set()

    def visit(body):
        for node in body:
            if isinstance(node, ast.ImportFrom):
                found.update(_resolve(mod, is_pkg, node))
            elif isinstance(node, ast.Import):
                found.update(a.name for a in node.names if a.name.startswith("disttensor"))
            elif isinstance(node, (ast.If, ast.Try, ast.With)):  # still module level
                visit(node.body)
                for h in getattr(node, "handlers", []):
                    visit(h.body)
                visit(getattr(node, "orelse", []))
                visit(getattr(node, "finalbody", []))
    visit(tree.body)
    # importing a.b.c runs a/__init__ and a/b/__init__ too
    closure = set()
    for name in found:
        parts = name.split(".")
        for k in range(2, len(parts) + 1):
            closure.add(".".join(parts[:k]))
    return {m for m in closure if m in MODULES and m != mod}


IMPORTS = {m: _toplevel_imports(m, p, i) for m, (p, i) in MODULES.items()}


def test_every_module_belongs_to_a_known_layer():
    unknown = sorted({_layer(m) for m in MODULES} - set(LAYERS))
    assert not unknown, f"add these folders/modules to LAYERS and docs/architecture.md: {unknown}"


@pytest.mark.parametrize("mod", sorted(MODULES))
def test_module_level_imports_respect_the_layers(mod):
    layer = _layer(mod)
    allowed = LAYERS[layer] | {layer}
    bad = sorted(m for m in IMPORTS[mod]
                 if _layer(m) not in allowed and m != "disttensor")
    assert not bad, (f"{mod} (layer {layer or 'disttensor'}) imports {bad} at module level; "
                     f"allowed layers: {sorted(allowed)} (import inside the function instead)")


def test_core_has_no_import_cycle():
    core = {m for m in MODULES if _layer(m) == "core" and m != "disttensor.core"}
    graph = {m: {d for d in IMPORTS[m] if d in core} for m in core}
    state: dict[str, int] = {}
    stack: list[str] = []

    def dfs(m):
        state[m] = 1
        stack.append(m)
        for d in sorted(graph[m]):
            if state.get(d) == 1:
                cyc = stack[stack.index(d):] + [d]
                raise AssertionError("import cycle in core: " + " -> ".join(cyc))
            if d not in state:
                dfs(d)
        stack.pop()
        state[m] = 2

    for m in sorted(core):
        if m not in state:
            dfs(m)


def test_the_foundation_imports_nothing_above_it():
    for m in MODULES:
        if _layer(m) == "core":
            above = sorted(d for d in IMPORTS[m] if _layer(d) != "core" and d != "disttensor")
            assert not above, f"{m} imports {above} at module level"


def test_no_module_over_the_size_limit():
    over = {}
    for m, (p, _) in MODULES.items():
        n = len(p.read_text().splitlines())
        if n > SIZE_LIMIT and m not in OVERSIZE:
            over[m] = n
    assert not over, (f"modules over {SIZE_LIMIT} lines (split them, or list them in OVERSIZE "
                      f"with the reason): {over}")


def test_oversize_exceptions_are_still_needed():
    for m in OVERSIZE:
        assert m in MODULES, f"{m} in OVERSIZE no longer exists"
        n = len(MODULES[m][0].read_text().splitlines())
        assert n > SIZE_LIMIT, f"{m} is {n} lines now: drop it from OVERSIZE"


def test_few_modules_directly_in_the_package():
    top = sorted(p.name for p in PKG.glob("*.py"))
    assert len(top) <= 12, f"{len(top)} modules directly in disttensor/: {top}"
