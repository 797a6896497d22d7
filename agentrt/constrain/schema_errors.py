"""Why a schema does not compile, in terms of the schema: the tool whose parameters hold it and
the keyword at fault, found from the grammar backend's message.

Backends report compile failures as free text ("Cannot find field 'nowhere' in #/nowhere",
"Regex parsing error at position 3"). A client that sent twenty tools needs to know which one
and which keyword, so the message is matched against cues and the keyword is looked up in the
schema (its JSON pointer). An unmatched message keeps the backend's text alone.
"""

from __future__ import annotations

import json
from typing import Any

from agentrt.errors import SchemaUnsupported

_KEYWORDS = ("$ref", "$defs", "definitions", "type", "enum", "const", "format", "pattern", "patternProperties",
             "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf", "minLength", "maxLength",
             "minItems", "maxItems", "uniqueItems", "prefixItems", "contains", "minProperties", "maxProperties",
             "additionalProperties", "propertyNames", "dependentSchemas", "dependentRequired", "required",
             "anyOf", "oneOf", "allOf", "not", "if", "then", "else")

# (cue in the backend's message, lower case) -> the schema keywords it points at, in order
_CUES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("cannot find field", ("$ref",)),
    ("pointer", ("$ref",)),
    ("ref", ("$ref",)),
    ("regex", ("pattern", "patternProperties")),
    ("pattern", ("pattern", "patternProperties")),
    ("unsupported type", ("type",)),
    ("range", ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "minLength", "maxLength",
               "minItems", "maxItems", "minProperties", "maxProperties")),
    ("format", ("format",)),
    ("enum", ("enum",)),
    ("const", ("const",)),
    ("anyof", ("anyOf",)),
    ("oneof", ("oneOf",)),
    ("allof", ("allOf",)),
)


def feature(schema_text: str, message: str) -> str | None:
    """'<keyword> at <JSON pointer>' for the keyword `message` points at, or None."""
    try:
        schema = json.loads(schema_text)
    except ValueError:
        return None
    low = message.lower()
    named = sorted((message.find(kw), (kw,)) for kw in _KEYWORDS if len(kw) > 4 and kw in message)
    for cue, keywords in [*((kw[0], kw) for _, kw in named), *_CUES]:
        if cue.lower() not in low:
            continue
        for kw in keywords:
            path = _find(schema, kw, "")
            if path is not None:
                return f"{kw} at {path}/{_escape(kw)}"
    return None


def _find(node: Any, keyword: str, path: str) -> str | None:
    """The pointer of the first object (depth first) that holds `keyword`."""
    stack = [(node, path)]
    while stack:
        item, where = stack.pop()
        if isinstance(item, dict):
            if keyword in item:
                return where
            stack.extend((v, f"{where}/{_escape(str(k))}") for k, v in reversed(list(item.items())))
        elif isinstance(item, list):
            stack.extend((v, f"{where}/{i}") for i, v in reversed(list(enumerate(item))))
    return None


def _escape(key: str) -> str:
    return key.replace("~", "~0").replace("/", "~1")


def unsupported(backend: str, message: str, *, tool: str | None, schema_text: str) -> SchemaUnsupported:
    """The typed error for a schema `backend` could not compile, naming the tool and the feature."""
    feat = feature(schema_text, message)
    where = f"the parameters of tool {tool!r}" if tool is not None else "the response schema"
    detail = f" ({feat})" if feat else ""
    return SchemaUnsupported(f"{backend} cannot compile {where}{detail}: {message}", tool=tool, feature=feat)
