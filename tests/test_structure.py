"""Structure, read from the AST of every module under agentrt/, kernels/ and integrations/ (no code
is run): no code reaches into another object's underscored attributes, and no two modules import
each other, directly or around a circle, counting the imports inside functions (a function-level
import that dodges a circle at import time still ties the two modules together)."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# folder -> the import name it installs as (pyproject.toml: kernels/ and integrations/ live under agentrt)
PACKAGES = {"agentrt": "agentrt", "kernels": "agentrt.kernels", "integrations": "agentrt.integrations"}
# underscored names that are public API by design (namedtuple's)
PUBLIC_UNDERSCORED = {"_replace", "_asdict", "_fields", "_make"}
ATTR_FUNCS = {"getattr", "setattr", "hasattr", "delattr"}


def modules() -> dict[str, Path]:
    """Import name -> file, for every module of the three folders."""
    out = {}
    for folder, package in PACKAGES.items():
        for path in sorted((ROOT / folder).rglob("*.py")):
            parts = list(path.relative_to(ROOT / folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join([package, *parts])] = path
    return out


def _private(name: object) -> bool:
    return (isinstance(name, str) and name.startswith("_") and not name.startswith("__")
            and name not in PUBLIC_UNDERSCORED)


def _owner_is_self(node: ast.expr) -> bool:
    """self / cls / super(): code of the class itself."""
    if isinstance(node, ast.Name):
        return node.id in ("self", "cls")
    return isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "super"


def reach_ins(tree: ast.AST) -> Iterator[tuple[int, str]]:
    """`x._name`, getattr(x, "_name"), x.__dict__["_name"] / .get("_name") with x not self/cls/super()."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and _private(node.attr) and not _owner_is_self(node.value):
            yield node.lineno, ast.unparse(node)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ATTR_FUNCS \
                and len(node.args) >= 2 and isinstance(node.args[1], ast.Constant) \
                and _private(node.args[1].value) and not _owner_is_self(node.args[0]):
            yield node.lineno, ast.unparse(node)
        elif _dict_key(node) is not None and _private(_dict_key(node)):
            yield node.lineno, ast.unparse(node)


def _dict_key(node: ast.AST) -> object:
    """The constant key of `x.__dict__[key]` or `x.__dict__.get(key, ...)` (x not self), else None."""
    if isinstance(node, ast.Subscript):
        target, key = node.value, node.slice
    elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get" and node.args:
        target, key = node.func.value, node.args[0]
    else:
        return None
    if isinstance(target, ast.Attribute) and target.attr == "__dict__" and not _owner_is_self(target.value) \
            and isinstance(key, ast.Constant):
        return key.value
    return None


def imports(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The modules of `known` that module `name` imports anywhere in its file."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            # `from pkg import mod` imports the module pkg.mod; `from mod import name`, mod itself
            targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base for alias in node.names]
        else:
            continue
        for target in targets:
            while target and target not in known:  # a name inside a module: the module
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
    return found


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, edges = work[-1]
            nxt = next(edges, None)
            if nxt is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        out.append(sorted(component))
            elif nxt not in index:
                index[nxt] = low[nxt] = len(index)
                stack.append(nxt)
                on_stack.add(nxt)
                work.append((nxt, iter(sorted(graph[nxt]))))
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
    return out


def test_no_code_reaches_into_another_objects_underscored_attributes():
    hits = [f"{path.relative_to(ROOT)}:{line}: {code}"
            for path in modules().values() for line, code in reach_ins(ast.parse(path.read_text()))]
    assert not hits, "give the owner a small public method or property instead:\n" + "\n".join(hits)


def test_no_import_circles_function_level_imports_included():
    known = modules()
    graph = {name: imports(name, path, known) for name, path in known.items()}
    found = circles(graph)
    assert not found, "modules importing each other (move the shared part below both, or the factory " \
                      "above them):\n" + "\n".join(" <-> ".join(c) for c in found)


def test_the_package_top_imports_no_subpackage():
    """agentrt/*.py (errors, checks, config, workflow, policy_names) sit below every subpackage: e.g.
    EngineConfig takes the policy names from policy_names.py, not from the implementations."""
    known = modules()
    top = {name for name, path in known.items() if path.parent == ROOT / "agentrt" and path.name != "__init__.py"}
    upward = {name: sorted(imports(name, known[name], known) - top) for name in sorted(top)}
    assert not any(upward.values()), f"upward imports: { {k: v for k, v in upward.items() if v} }"


# Every folder of agentrt/ (kernels/ and integrations/ install under it) is a room, lowest first: a
# room imports only rooms below it (and the top-level modules), no exception. kernels/ computes;
# state/ stores records on disk and in SQL; toolcall/ parses; adapters/ reads LoRA files; kv/ holds,
# matches, reclaims and moves pages (KVStore included: of a model it knows only the KV shape);
# records/ is what the rooms above share (a request, its sampling parameters, the constraint
# contract); sampling/ picks tokens; model/ runs the forward; constrain/ implements the constraint
# contract; scheduling/ decides; engine/ runs the step over all of them; above it, the faces.
ROOMS = ("agentrt.kernels", "agentrt.state", "agentrt.toolcall", "agentrt.tracing", "agentrt.adapters",
         "agentrt.kv", "agentrt.records", "agentrt.sampling", "agentrt.model", "agentrt.constrain",
         "agentrt.scheduling", "agentrt.engine", "agentrt.tools", "agentrt.conversation", "agentrt.runtime",
         "agentrt.sim", "agentrt.dashboard", "agentrt.integrations.ray", "agentrt.server",
         "agentrt.integrations.langgraph", "agentrt.cli")


def _room(name: str) -> str | None:
    """The room a module belongs to (None: a top-level module or the package root)."""
    parts = name.split(".")
    if len(parts) < 3 and not (len(parts) == 2 and (ROOT / "agentrt" / parts[1]).is_dir()):
        return None
    return ".".join(parts[:3]) if parts[1] == "integrations" else ".".join(parts[:2])


def test_every_folder_is_a_room():
    folders = {_room(n) for n in modules()} - {None, "agentrt.integrations"}
    assert folders == set(ROOMS), f"folders missing from ROOMS: {sorted(folders - set(ROOMS))}; " \
                                  f"rooms without a folder: {sorted(set(ROOMS) - folders)}"


def test_the_rooms_import_only_downward():
    known = modules()
    upward = {}
    for name, path in known.items():
        room = _room(name)
        if room not in ROOMS:
            continue
        above = ROOMS[ROOMS.index(room) + 1:]
        bad = sorted(m for m in imports(name, path, known) if _room(m) in above)
        if bad:
            upward[name] = bad
    assert not upward, f"a room imports one above it: {upward}"


# toolcall/ is the sans-I/O tool-call parser: text in, events out. No tensors, threads or grammar
# engines (those are agentrt/constrain/'s), no I/O, and of agentrt only itself and the top-level
# vocabulary (errors, checks).
TOOLCALL_FORBIDDEN = {"torch", "numpy", "threading", "concurrent", "multiprocessing", "asyncio", "anyio",
                      "trio", "socket", "subprocess", "xgrammar", "llguidance"}


def _imported_roots(tree: ast.AST) -> Iterator[tuple[int, str]]:
    """(line, dotted name) of every absolute import in a module, function-level ones included, and
    of every __import__("name") / importlib.import_module("name") of a constant name."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from ((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            yield node.lineno, node.module
        elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant) \
                and ast.unparse(node.func) in ("__import__", "importlib.import_module", "import_module"):
            yield node.lineno, str(node.args[0].value)


def test_toolcall_is_a_sans_io_parser():
    bad = []
    for path in sorted((ROOT / "agentrt" / "toolcall").rglob("*.py")):
        for line, name in _imported_roots(ast.parse(path.read_text())):
            root = name.split(".")[0]
            inner = name.split(".")[1] if name.startswith("agentrt.") else None
            if root in TOOLCALL_FORBIDDEN or inner not in (None, "toolcall", "errors", "checks"):
                bad.append(f"{path.relative_to(ROOT)}:{line}: {name}")
    assert not bad, "agentrt/toolcall/ imports what a sans-I/O parser must not:\n" + "\n".join(bad)


def test_the_checks_catch_what_they_look_for():
    """The detectors on small sources: each rule fires, and self/cls/super() stay allowed."""
    bad = ('x._a\ngetattr(x, "_b", None)\nx.__dict__["_c"]\nx.__dict__.get("_d")\nsetattr(o, "_e", 1)\n'
           'self._ok\ncls._ok\nsuper()._ok\ngetattr(self, "_ok")\nx.__ok__\nt._replace(a=1)\n')
    assert [line for line, _ in reach_ins(ast.parse(bad))] == [1, 2, 3, 4, 5]
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert circles({"a": {"b"}, "b": set()}) == []
    src = 'import torch\nfrom agentrt.model import x\nfrom . import y\ndef f():\n    import threading.local\n' \
          '    __import__("xgrammar")\n'
    assert sorted(n for _, n in _imported_roots(ast.parse(src))) == \
        ["agentrt.model", "threading.local", "torch", "xgrammar"]
