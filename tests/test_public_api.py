"""The public surface, pinned: `agentrt.__all__` is exactly this sorted list (a name added or
dropped fails here on purpose: update the list and the docs together), internals and aliases
are not exported at the top level, and the error tree is pinned. (No code reaching into another
object's underscored attributes: tests/test_structure.py, from the AST.)"""

from __future__ import annotations

import re
import types

import agentrt
from agentrt import errors

PUBLIC = [
    "ActorRef", "AdapterInfo", "Agent", "AgentAwarePolicy", "AgentSpec", "CallLimits", "ChatFormat", "Completion", "ContextPolicy", "Conversation",
    "DEFAULT_MODEL", "Engine", "EngineConfig", "EngineLike", "EngineStats", "EvictionPolicy", "LRUPolicy",
    "LoadedModel", "ModelConfig", "RoundEnd", "Runtime", "SamplingParams", "Session", "Supervision",
    "TokenEvent", "Tool", "ToolCallParser", "ToolContext", "ToolFormat", "ToolResult", "Toolset",
    "TurnResult", "Usage", "Workflow", "current_task", "dashboard", "detect_tool_format", "errors", "load_model",
    "task_scope", "tool", "tracing",
]


def test_all_is_exactly_the_pinned_sorted_list():
    assert agentrt.__all__ == sorted(agentrt.__all__), "keep __all__ sorted"
    missing = sorted(set(PUBLIC) - set(agentrt.__all__))
    extra = sorted(set(agentrt.__all__) - set(PUBLIC))
    assert not missing and not extra, f"missing from __all__: {missing}; not pinned: {extra}"
    assert len(agentrt.__all__) == len(set(agentrt.__all__))
    for name in agentrt.__all__:
        assert getattr(agentrt, name, None) is not None, name


def test_no_public_name_outside_all():
    """Every public attribute of the package (submodules aside) is in __all__."""
    stray = sorted(n for n, v in vars(agentrt).items()
                   if not n.startswith("_") and not isinstance(v, types.ModuleType) and n not in agentrt.__all__)
    assert not stray, f"exported but not in __all__: {stray}"


def test_internals_and_aliases_are_not_exported_but_stay_importable():
    for name in ("DecoderModel", "generate", "GenerationSettings"):
        assert not hasattr(agentrt, name), name
    from agentrt.model.decoder import DecoderModel
    from agentrt.model.generate import generate
    from agentrt.runtime.agent import GenerationSettings

    assert callable(generate) and isinstance(DecoderModel, type)
    assert GenerationSettings is agentrt.SamplingParams  # an alias: agents take SamplingParams


def test_star_import_gives_exactly_all():
    ns: dict = {}
    exec("from agentrt import *", ns)
    assert sorted(k for k in ns if k != "__builtins__") == sorted(PUBLIC)


# The exception tree, pinned: each error and its bases (the builtin ones callers catch included).
# `errors.__all__` is computed from the classes, so it is checked against this literal, not trusted.
ERROR_TREE = {
    "AgentrtError": ("Exception",),
    "ConfigError": ("AgentrtError", "ValueError"),
    "SnapshotMismatch": ("ConfigError",),
    "ModelLoadError": ("AgentrtError",),
    "ModelNotFound": ("ModelLoadError", "FileNotFoundError"),
    "CorruptModelFile": ("ModelLoadError",),
    "UnsupportedModel": ("ModelLoadError",),
    "TokenizerError": ("AgentrtError",),
    "AdapterError": ("ConfigError",),
    "AdapterMismatch": ("AdapterError",),
    "UnsupportedAdapter": ("AdapterError",),
    "UnknownAdapter": ("AdapterError", "LookupError"),
    "ChatTemplateError": ("AgentrtError",),
    "ContextLengthExceeded": ("AgentrtError", "ValueError"),
    "ResourceError": ("AgentrtError",),
    "PoolExhausted": ("ResourceError", "TimeoutError"),
    "OutOfKVMemory": ("ResourceError",),
    "DeviceOutOfMemory": ("ResourceError",),
    "StateStoreError": ("ResourceError",),
    "EngineClosed": ("AgentrtError", "RuntimeError"),
    "EngineFailed": ("EngineClosed",),
    "SessionBusy": ("AgentrtError", "RuntimeError"),
    "RequestCancelled": ("AgentrtError",),
    "GenerationTimeout": ("AgentrtError", "TimeoutError"),
    "ReplicaLost": ("AgentrtError",),
    "ToolError": ("AgentrtError",),
    "ToolDefinitionError": ("ToolError", "TypeError"),
    "ToolCallError": ("ToolError",),
    "GrammarError": ("AgentrtError",),
    "SchemaUnsupported": ("GrammarError",),
    "ActorError": ("AgentrtError",),
    "MailboxFull": ("ActorError",),
    "ActorStopped": ("ActorError",),
    "AskTimeout": ("ActorError", "TimeoutError"),
    "AskCycle": ("ActorError",),
}


def test_the_error_tree_is_pinned():
    assert sorted(errors.__all__) == sorted(ERROR_TREE), "an error added or dropped: update ERROR_TREE and the docs"
    for name, bases in ERROR_TREE.items():
        assert tuple(b.__name__ for b in getattr(errors, name).__bases__) == bases, name


def test_the_error_tree_drawing_matches_the_classes():
    """The tree drawn in agentrt/errors.py's docstring: every error once, under its parent."""
    drawn, parents = {}, []  # name -> parent drawn; the chain of names above the current line
    for line in errors.__doc__.splitlines():
        m = re.match(r"^ {4}((?:[│ ] {3})*)(?:[├└]── )?([A-Z]\w+)(?:\s{2,}|$)", line)  # (the docstring's indent)
        if not m:
            continue
        depth = len(m.group(1)) // 4 + (0 if m.group(2) == "AgentrtError" else 1)
        parents[depth:] = [m.group(2)]
        drawn[m.group(2)] = parents[depth - 1] if depth else None
    assert drawn == {name: None if name == "AgentrtError" else bases[0] for name, bases in ERROR_TREE.items()}
