"""`ChatAgentrt.with_structured_output`: a schema's output, by one of three methods.

  * "json_schema" (default): the reply is one JSON value decoded under the schema's grammar.
  * "json_mode": the reply is any JSON object (a grammar for JSON objects, not the schema: say
    the keys in the prompt, as with OpenAI's JSON mode); parsed into the schema when one is given.
  * "function_calling": a forced call of the schema as a tool, parsed from the call's arguments.

`strict`: True holds the reply to the schema under a grammar; False does not -- "json_schema"
then decodes under the JSON-object grammar only, and "function_calling" decodes the call freely
(the validator still checks it; a call that fails lands in `invalid_tool_calls`); None is the
method's default: the schema's grammar for "json_schema", the model's `constrained` for
"function_calling". Every method binds `ls_structured_output_format` (method, strict and
schema), which LangChain's callbacks and tracing read. Pydantic 2 and `pydantic.v1` classes come
back as instances of the class; TypedDicts and JSON schemas as dicts.
"""

from __future__ import annotations

from collections.abc import Mapping
from operator import itemgetter
from typing import Any

from langchain_core.output_parsers import JsonOutputParser, PydanticOutputParser
from langchain_core.output_parsers.openai_tools import JsonOutputKeyToolsParser, PydanticToolsParser
from langchain_core.runnables import Runnable, RunnableMap, RunnablePassthrough
from langchain_core.utils.function_calling import convert_to_openai_tool
from langchain_core.utils.pydantic import is_basemodel_subclass

from agentrt.errors import ConfigError

from .messages import structured_schema

METHODS = ("json_schema", "json_mode", "function_calling")
JSON_OBJECT = {"type": "object"}  # any JSON object (the grammar allows every key)


def check_strict(strict: Any) -> bool | None:
    """`strict` as LangChain passes it: True, False or None (the default)."""
    if strict is not None and not isinstance(strict, bool):
        raise ConfigError(f"strict must be True, False or None, got {strict!r}")
    return strict


def structured_output(model: Any, schema: Any, method: str, include_raw: bool, strict: bool | None) -> Runnable:
    """The runnable `model.with_structured_output(schema, method=, include_raw=, strict=)` returns."""
    if method not in METHODS:
        raise ConfigError(f"method must be one of {', '.join(map(repr, METHODS))}, got {method!r}")
    check_strict(strict)
    if schema is None and method != "json_mode":
        raise ConfigError(f"method {method!r} needs a schema (only 'json_mode' takes schema=None)")
    fmt = {"kwargs": {"method": method, "strict": strict}, "schema": schema}
    pydantic_class = schema if isinstance(schema, type) and is_basemodel_subclass(schema) else None
    parser: Runnable  # (an output parser of the reply)
    if method == "function_calling":
        llm = model.bind_tools([schema], tool_choice="any", strict=strict, parallel_tool_calls=False,
                               ls_structured_output_format=fmt)
        parser = (PydanticToolsParser(tools=[schema], first_tool_only=True) if pydantic_class is not None else
                  JsonOutputKeyToolsParser(key_name=convert_to_openai_tool(schema)["function"]["name"],
                                           first_tool_only=True))
    else:
        if method == "json_schema" and strict is not False:
            response_format = structured_schema(schema)[0]
        else:
            response_format = JSON_OBJECT
        llm = model.bind(response_format=response_format, ls_structured_output_format=fmt)
        parser = PydanticOutputParser(pydantic_object=pydantic_class) if pydantic_class is not None \
            else JsonOutputParser()
    if not include_raw:
        return llm | parser
    parsed = RunnablePassthrough.assign(parsed=itemgetter("raw") | parser, parsing_error=lambda _: None)
    fallback = RunnablePassthrough.assign(parsed=lambda _: None)
    return RunnableMap(raw=llm) | parsed.with_fallbacks([fallback], exception_key="parsing_error")


def response_schema(fmt: Any) -> Any:
    """The JSON schema of a `response_format` call argument: as given (with_structured_output
    binds the schema itself), any JSON object for OpenAI's `{"type": "json_object"}`, or
    unwrapped from OpenAI's `{"type": "json_schema", "json_schema": {"name", "schema", ...}}`,
    the form LangChain's `ProviderStrategy` (create_agent) binds."""
    if isinstance(fmt, Mapping) and fmt.get("type") in ("json_object", "text") and len(fmt) == 1:
        return JSON_OBJECT if fmt["type"] == "json_object" else None  # OpenAI's JSON mode / plain text
    if isinstance(fmt, Mapping) and fmt.get("type") == "json_schema" and "json_schema" in fmt:
        schema = fmt["json_schema"].get("schema") if isinstance(fmt["json_schema"], Mapping) else None
        if not isinstance(schema, Mapping):
            raise ConfigError(f"response_format {fmt!r} has no json_schema.schema")
        return dict(schema)
    return fmt
