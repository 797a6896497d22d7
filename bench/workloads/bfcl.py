"""BFCL v4 multi-turn entries, replayed from their ground truth against BFCL's real tool code.

The `bfcl-eval` wheel is read as a zip archive, never installed: questions, ground-truth calls,
function docs, and the tool classes' source, executed into private module objects (bfcl_eval's
package and its heavy dependencies are never imported). Each entry becomes a message-level
conversation: per turn the user message(s), then per model round the ground-truth tool calls
and the results of really executing them.
"""

from __future__ import annotations

import ast
import builtins
import copy
import inspect
import json
import logging
import random
import re
import subprocess
import sys
import types
import zipfile
from dataclasses import dataclass
from pathlib import Path

from jsonschema import Draft202012Validator
from jsonschema.exceptions import best_match

from bench.common import ROOT

BFCL_VERSION = "2026.3.23"
DEFAULT_CACHE = ROOT / "bench" / ".cache"
SYSTEM_PROMPT = ("You are an expert in composing functions. Given a question and a set of possible "
                 "functions, make one or more function/tool calls to achieve the purpose. If none "
                 "of the functions can be used, or parameters are missing, point it out.")
_DATA = "bfcl_eval/data/"
_SRC_PKG = "bfcl_eval.eval_checker.multi_turn_eval.func_source_code"
_SRC_DIR = _SRC_PKG.replace(".", "/") + "/"
_TYPES = types.MappingProxyType({"dict": "object", "float": "number", "tuple": "array",
                                 "list": "array", "int": "integer", "str": "string",
                                 "bool": "boolean"})
_NESTED = frozenset({"items", "additionalProperties", "anyOf", "oneOf", "allOf"})
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class BfclTurn:
    """One user turn: the new user message(s), then the model rounds answering it."""

    user: list[dict]  # the new user message(s) of this turn, OpenAI message dicts
    # per model round: (tool calls [{"name", "arguments"}], tool results [{"role": "tool",
    # "name", "content"}]); empty when the turn's ground truth has no call
    rounds: list[tuple[list[dict], list[dict]]]


@dataclass(frozen=True)
class BfclEntry:
    """A replayed BFCL multi-turn entry."""

    id: str
    category: str
    system: str
    tools: list[dict]  # OpenAI tool schemas: {"type": "function", "function": {...}}
    turns: list[BfclTurn]


def bfcl_wheel(cache_dir: Path | None = None) -> Path:
    """Path of a cached `bfcl_eval-*.whl` (the pinned version preferred), else download the pinned
    version there with pip; RuntimeError saying what to do when that fails."""
    cache = Path(cache_dir) if cache_dir is not None else DEFAULT_CACHE
    found = sorted(cache.glob(f"bfcl_eval-{BFCL_VERSION}-*.whl"))
    found = found or sorted(cache.glob("bfcl_eval-*.whl"))
    if found:
        return found[-1]
    cache.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
           f"bfcl-eval=={BFCL_VERSION}", "-d", str(cache)]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        why = (proc.stderr or proc.stdout).strip()[-500:]
    except (OSError, subprocess.TimeoutExpired) as exc:
        why = str(exc)
    found = sorted(cache.glob("bfcl_eval-*.whl"))
    if not found:
        raise RuntimeError(
            f"could not download the bfcl-eval wheel ({' '.join(cmd)}: {why}). Download "
            f"bfcl_eval-{BFCL_VERSION}-py3-none-any.whl from PyPI by hand and put it in {cache}.")
    return found[-1]


def _exec_module(stem: str, tree: ast.Module, loaded: dict[str, types.ModuleType]):
    """Execute one tool module's code into a fresh module object; its imports of sibling tool
    modules are served from `loaded` (never from sys.modules), others by the real import."""
    def hook(name, globals=None, locals=None, fromlist=(), level=0):
        if level == 0 and fromlist and name.rpartition(".")[0] == _SRC_PKG:
            if name.rpartition(".")[2] not in loaded:
                raise ImportError(f"{name} is not loaded")
            return loaded[name.rpartition(".")[2]]
        return builtins.__import__(name, globals, locals, fromlist, level)
    module = types.ModuleType(f"{_SRC_PKG}.{stem}")
    module.__file__ = f"<bfcl wheel>/{_SRC_DIR}{stem}.py"
    module.__dict__["__builtins__"] = {**vars(builtins), "__import__": hook}
    exec(compile(tree, module.__file__, "exec"), module.__dict__)
    return module


def _json_schema(node):
    """A BFCL parameter schema turned into valid JSON Schema (type names mapped, recursively)."""
    if isinstance(node, list):
        return [_json_schema(v) for v in node]
    if not isinstance(node, dict):
        return node
    out = {k: _json_schema(v) if k in _NESTED else v for k, v in node.items() if k != "type"}
    if isinstance(node.get("properties"), dict):
        out["properties"] = {p: _json_schema(v) for p, v in node["properties"].items()}
    kind = node.get("type", "any")
    if kind != "any":  # "any" allows every type: no "type" keyword at all
        out["type"] = _TYPES.get(kind, kind) if isinstance(kind, str) else kind
    return out


def _tool_name(name: str) -> str:
    """A function name made valid for `^[a-zA-Z0-9_-]+$` (dots become underscores)."""
    return name.replace(".", "_")


def _tool_schema(doc: dict) -> dict:
    """An OpenAI tool schema from one BFCL function doc (the `response` part is dropped)."""
    return {"type": "function", "function": {
        "name": _tool_name(doc["name"]), "description": doc.get("description", ""),
        "parameters": _json_schema(doc.get("parameters", {"type": "dict", "properties": {}}))}}


def _signatures(cls: type) -> dict[str, inspect.Signature]:
    """Public tool name -> call signature (without `self`) of a tool class's methods."""
    out = {}
    for name, func in inspect.getmembers(cls, inspect.isfunction):
        if not name.startswith("_"):
            params = list(inspect.signature(func).parameters.values())
            static = isinstance(inspect.getattr_static(cls, name), staticmethod)
            out[_tool_name(name)] = inspect.Signature(params if static else params[1:])
    return out


@dataclass(frozen=True)
class _ToolClass:
    """An executable BFCL tool class with its tool schemas, method signatures and validators."""

    cls: type
    tools: list[dict]
    signatures: dict[str, inspect.Signature]
    validators: dict[str, Draft202012Validator]


def _tool_class(cls: type, docs: list[dict]) -> _ToolClass:
    """A tool class with the schemas of its function docs, its signatures and validators."""
    tools = [_tool_schema(d) for d in docs]
    validators = {t["function"]["name"]: Draft202012Validator(t["function"]["parameters"])
                  for t in tools}
    return _ToolClass(cls, tools, _signatures(cls), validators)


class _Backend:
    """What is read from the wheel: data files, function docs, and tool classes loaded on use."""

    def __init__(self, wheel: Path):
        self.wheel = wheel
        with zipfile.ZipFile(wheel) as zf:
            names = zf.namelist()
            self.sources = {n[len(_SRC_DIR):-3]: zf.read(n).decode() for n in names
                            if n.startswith(_SRC_DIR) and n.endswith(".py")}
        self.docs = {n.rsplit("/", 1)[1][:-5]: self.read(n) for n in names
                     if n.startswith(_DATA + "multi_turn_func_doc/") and n.endswith(".json")}
        self.class_module = {c: stem for stem, src in self.sources.items()
                             for c in re.findall(r"^class\s+(\w+)", src, re.MULTILINE)}
        self.loaded: dict[str, types.ModuleType] = {}
        self.failed: dict[str, str] = {}
        self.classes: dict[str, _ToolClass | str] = {}

    def read(self, name: str) -> list[dict]:
        """A JSON-lines file of the wheel, one dict per non-empty line."""
        with zipfile.ZipFile(self.wheel) as zf:
            lines = zf.read(name).decode().splitlines()
        return [json.loads(line) for line in lines if line.strip()]

    def module(self, stem: str) -> types.ModuleType | None:
        """The tool module `stem` (after the sibling modules it imports), None if it can't load."""
        if stem in self.loaded or stem in self.failed:
            return self.loaded.get(stem)
        tree = ast.parse(self.sources[stem])
        deps = [n.module.rpartition(".")[2] for n in tree.body if isinstance(n, ast.ImportFrom)
                and (n.module or "").rpartition(".")[0] == _SRC_PKG]
        self.failed[stem] = "circular import"  # provisional, while its dependencies load
        for dep in deps:
            if dep in self.sources and self.module(dep) is None:
                self.failed[stem] = f"needs {dep}: {self.failed[dep]}"
                return None
        try:
            self.loaded[stem] = _exec_module(stem, tree, self.loaded)
            del self.failed[stem]
        except Exception as exc:  # an unavailable third-party import, mostly
            self.failed[stem] = f"{type(exc).__name__}: {exc}"
        return self.loaded.get(stem)

    def tool_class(self, name: str) -> _ToolClass:
        """The tool class `name`, loaded once; ValueError saying why when it is unavailable."""
        if name not in self.classes:
            stem = self.class_module.get(name)
            module = self.module(stem) if stem in self.docs else None
            if module is None:
                self.classes[name] = f"class {name}: " + self.failed.get(stem, "no source or doc")
            else:
                self.classes[name] = _tool_class(getattr(module, name), self.docs[stem])
        if isinstance(self.classes[name], str):
            raise ValueError(self.classes[name])
        return self.classes[name]


def _parse_call(text: str) -> tuple[str, list, dict]:
    """(name, positional args, keyword args) of a call string like `cd(folder='x')`; only
    literal values are accepted (nothing is evaluated)."""
    node = ast.parse(text.strip(), mode="eval").body
    if not isinstance(node, ast.Call):
        raise ValueError(f"not a call: {text!r}")
    args = [ast.literal_eval(a) for a in node.args]
    kwargs = {k.arg: ast.literal_eval(k.value) for k in node.keywords if k.arg is not None}
    return _tool_name(ast.unparse(node.func)), args, kwargs


@dataclass(frozen=True)
class _Prepared:
    """An eligible entry: its question, tool classes and schemas, and per turn its ground-truth
    calls as (name, arguments) with arguments bound to parameter names and JSON-normalised."""

    question: dict
    classes: dict[str, type]
    tools: list[dict]
    calls: list[list[tuple[str, dict]]]


def _bound_call(text: str, classes: list[_ToolClass]) -> tuple[str, dict]:
    """(name, arguments) of a ground-truth call string, checked against the tool's signature
    and JSON schema; raises ValueError saying why it does not fit."""
    name, args, kwargs = _parse_call(text)
    owner = next((c for c in classes if name in c.signatures and name in c.validators), None)
    if owner is None:
        raise ValueError(f"ground-truth call {text!r} is not among the entry's tools")
    try:
        arguments = json.loads(json.dumps(owner.signatures[name].bind(*args, **kwargs).arguments))
    except TypeError as exc:
        raise ValueError(f"ground-truth call {text!r} does not bind: {exc}") from None
    error = best_match(owner.validators[name].iter_errors(arguments))
    if error is not None:
        raise ValueError(f"ground-truth call {text!r} violates the tool schema: {error.message}")
    return name, arguments


def _prepare(backend: _Backend, question: dict, answer: dict) -> _Prepared:
    """An entry's classes, tool schemas and parsed ground truth; raises ValueError with the
    reason when the entry is not eligible."""
    classes = {name: backend.tool_class(name) for name in question["involved_classes"]}
    calls = [[_bound_call(c, list(classes.values())) for c in turn]
             for turn in answer["ground_truth"]]
    return _Prepared(question, {n: c.cls for n, c in classes.items()},
                     [t for c in classes.values() for t in c.tools], calls)


def _instances(classes: dict[str, type], config: dict, long_context: bool) -> dict:
    """Fresh tool instances for one entry, their scenarios loaded; public method name -> method."""
    methods = {}
    for name, cls in classes.items():
        obj = cls()
        if hasattr(obj, "_load_scenario"):
            obj._load_scenario(copy.deepcopy(config.get(name, {})), long_context=long_context)
        methods.update({_tool_name(m): f for m, f in inspect.getmembers(obj, inspect.isroutine)
                        if not m.startswith("_")})
    return methods


def _execute(methods: dict, name: str, arguments: dict) -> dict:
    """Run one tool call on the entry's instances; its tool result message, whose content is a
    non-empty string result as it is, else the result's JSON (else its str), or "Error: ..."."""
    try:
        value = methods[name](**arguments)
    except Exception as exc:
        return {"role": "tool", "name": name, "content": f"Error: {type(exc).__name__}: {exc}"}
    try:
        result = value if isinstance(value, str) and value else json.dumps(value)
    except (TypeError, ValueError):  # e.g. an mpmath number inside: BFCL's str() rendering
        result = str(value)
    return {"role": "tool", "name": name, "content": result}


def _replay(prep: _Prepared, one_call_per_round: bool, max_turns: int | None) -> BfclEntry:
    """Replay one entry's ground truth against fresh tool instances into a BfclEntry."""
    q = prep.question
    category = q["id"].rsplit("_", 1)[0]
    methods = _instances(prep.classes, q.get("initial_config", {}), "long_context" in category)
    turns = []
    for user, calls in list(zip(q["question"], prep.calls))[:max_turns]:
        done = [({"name": n, "arguments": a}, _execute(methods, n, copy.deepcopy(a)))
                for n, a in copy.deepcopy(calls)]
        groups = [[d] for d in done] if one_call_per_round else [done] if done else []
        rounds = [([c for c, _ in g], [r for _, r in g]) for g in groups]
        turns.append(BfclTurn(user=list(user), rounds=rounds))
    return BfclEntry(id=q["id"], category=category, system=SYSTEM_PROMPT,
                     tools=copy.deepcopy(prep.tools), turns=turns)


def eligible_bfcl(categories=("multi_turn_base",),
                  wheel: Path | None = None) -> tuple[list[_Prepared], dict[str, str]]:
    """(the eligible entries of `categories` in the files' (id) order, {entry id: reason} for
    the skipped ones)."""
    backend = _Backend(wheel or bfcl_wheel())
    found, skipped = [], {}
    for category in categories:
        questions = backend.read(f"{_DATA}BFCL_v4_{category}.json")
        answers = {a["id"]: a
                   for a in backend.read(f"{_DATA}possible_answer/BFCL_v4_{category}.json")}
        for q in questions:
            try:
                if q["id"] not in answers:
                    raise ValueError("no ground truth")
                found.append(_prepare(backend, q, answers[q["id"]]))
            except (ValueError, SyntaxError) as exc:
                skipped[q["id"]] = str(exc)
    return found, skipped


def load_bfcl(n: int, *, seed: int = 0, categories=("multi_turn_base",),
              max_turns: int | None = None, wheel: Path | None = None,
              one_call_per_round: bool = True) -> list[BfclEntry]:
    """`n` BFCL entries of `categories` chosen with `random.Random(seed)` and replayed.

    Each ground-truth call is its own model round (as in BFCL's ground-truth conversations) unless
    `one_call_per_round` is False, which puts a turn's calls in one round of parallel calls.
    `max_turns` keeps only the first turns of each entry. Ineligible entries are logged.
    (Tools are every function of the entry's classes; miss_func's held-out functions stay in.)"""
    found, skipped = eligible_bfcl(categories, wheel)
    for entry_id, reason in skipped.items():
        log.info("bfcl: skipped %s: %s", entry_id, reason)
    chosen = random.Random(seed).sample(found, min(n, len(found)))
    return [_replay(prep, one_call_per_round, max_turns) for prep in chosen]


def _main() -> None:
    """Print the eligibility of multi_turn_base and a summary of 3 replayed entries."""
    found, skipped = eligible_bfcl()
    print(f"multi_turn_base: {len(found)} eligible, skipped: {skipped}")
    for entry in load_bfcl(3):
        rounds = [r for t in entry.turns for r in t.rounds]
        calls = [(c, m) for cs, ms in rounds for c, m in zip(cs, ms)]
        print(f"{entry.id}: {len(entry.tools)} tools ({len(json.dumps(entry.tools))} chars), "
              f"{len(entry.turns)} turns, {len(rounds)} rounds, {len(calls)} calls, "
              f"{sum(len(m['content']) for _, m in calls)} chars of tool results")
        if calls:
            (call, msg) = calls[0]
            print(f"  e.g. {call['name']}({json.dumps(call['arguments'])}) -> "
                  f"{msg['content'][:200]}")


if __name__ == "__main__":
    _main()
