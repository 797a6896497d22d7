"""Tool definitions: a typed Python function (or an OpenAI tool dict + callable) -> `Tool`.

    @tool
    def search(query: str, limit: int = 5) -> list[str]:
        '''Search the notes.

        Args:
            query: words to look for
            limit: most results to return
        '''

The argument model is a pydantic model built from the signature: type hints, defaults,
`Annotated[..., Field(...)]` metadata and per-parameter docstring descriptions (Google, NumPy
or Sphinx style). Unknown arguments are rejected so a misspelt name reaches the model as an
error instead of being silently dropped. A parameter annotated `ToolContext` is injected by
the dispatcher and does not appear in the schema.
"""

from __future__ import annotations

import copy
import functools
import inspect
import re
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, overload

import pydantic
from pydantic.fields import FieldInfo
from pydantic.json_schema import GenerateJsonSchema

from agentrt.errors import ConfigError, ToolCallError, ToolDefinitionError
from agentrt.toolcall.specs import load_tool_specs
from agentrt.tools.docstrings import parse_docstring
from agentrt.tools.results import describe_validation_error

_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")  # what OpenAI-style tool APIs accept
Validator = Callable[[Mapping[str, Any]], dict[str, Any]]


@dataclass(frozen=True)
class ToolContext:
    """Run-scoped information handed to tools that declare a `ToolContext` parameter.

    The dispatcher fills `call_id`, `tool_name` and `attempt` per call; `agent` and `deps`
    (whatever the run wants its tools to share: clients, stores, settings) come from the
    caller's context.
    """

    agent: str = ""
    deps: Any = None
    call_id: str = ""
    tool_name: str = ""
    attempt: int = 1


@dataclass(frozen=True, eq=False)
class Tool:
    """A callable tool: its model-facing definition plus how to validate and run a call.

    `validate(arguments)` returns the keyword arguments for `fn` (without the context
    parameter) or raises ToolCallError with a message written for the model. Calling the
    Tool calls `fn` directly, so a decorated function stays usable from Python.
    """

    name: str
    description: str
    parameters: dict[str, Any]  # JSON schema of the arguments object; treat as read-only
    fn: Callable[..., Any]
    validate: Validator = field(repr=False)
    is_async: bool = False
    timeout: float | None = None
    retries: int = 0
    strict: bool = False
    context_param: str | None = None
    pure: bool = False  # side-effect free: may run as soon as its call validates, mid-generation

    def __post_init__(self) -> None:
        _check_settings(self.name, self.timeout, self.retries)
        if not isinstance(self.pure, bool):
            raise ToolDefinitionError(f"pure of tool {self.name!r} must be a bool, got {self.pure!r}")

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.fn(*args, **kwargs)

    def openai_schema(self) -> dict[str, Any]:
        """{"type": "function", "function": {name, description, parameters}}; a fresh copy."""
        parameters = copy.deepcopy(self.parameters)
        return {"type": "function",
                "function": {"name": self.name, "description": self.description, "parameters": parameters}}

    @classmethod
    def from_function(cls, fn: Callable[..., Any], *, name: str | None = None,
                      description: str | None = None, timeout: float | None = None, retries: int = 0,
                      strict: bool = False, pure: bool = False) -> Tool:
        """Build a Tool from a typed function; see the module docstring. strict=True turns off
        pydantic's type coercion ("3" is no longer accepted for an int)."""
        if isinstance(fn, Tool) or not callable(fn):
            raise ToolDefinitionError(f"a tool needs a plain callable, got {type(fn).__name__}")
        name = name if name is not None else _name_of(fn)
        _check_settings(name, timeout, retries)  # cheap checks first, before introspection
        doc_description, doc_params = parse_docstring(inspect.getdoc(_unwrap_partial(fn)))
        model, fields, context_param = _argument_model(fn, name, doc_params, strict)
        return cls(name=name, description=description if description is not None else doc_description,
                   parameters=_json_schema(model, name), fn=fn, validate=_model_validator(model, fields),
                   is_async=_is_async(fn), timeout=timeout, retries=retries, strict=strict,
                   context_param=context_param, pure=pure)

    @classmethod
    def from_openai(cls, spec: Mapping[str, Any], fn: Callable[..., Any], *, timeout: float | None = None,
                    retries: int = 0, pure: bool = False) -> Tool:
        """Wrap `fn` under an existing OpenAI tool definition; arguments are checked against
        its JSON schema (no coercion) and passed to `fn` as keyword arguments."""
        if not callable(fn):
            raise ToolDefinitionError(f"a tool needs a callable, got {type(fn).__name__}")
        try:
            (tool_spec,) = load_tool_specs([spec]).values()
        except ConfigError as exc:
            raise ToolDefinitionError(f"bad OpenAI tool definition: {exc}") from None
        return cls(name=tool_spec.name, description=tool_spec.description,
                   parameters=copy.deepcopy(dict(tool_spec.parameters)), fn=fn,
                   validate=_schema_validator(tool_spec), is_async=_is_async(fn), timeout=timeout,
                   retries=retries, context_param=_find_context_param(fn), pure=pure)


@overload
def tool(fn: Callable[..., Any], /) -> Tool: ...
@overload
def tool(*, name: str | None = None, description: str | None = None, timeout: float | None = None,
         retries: int = 0, strict: bool = False, pure: bool = False) -> Callable[[Callable[..., Any]], Tool]: ...


def tool(fn: Callable[..., Any] | None = None, /, *, name: str | None = None,
         description: str | None = None, timeout: float | None = None, retries: int = 0,
         strict: bool = False, pure: bool = False) -> Tool | Callable[[Callable[..., Any]], Tool]:
    """Decorator: `@tool` or `@tool(name=..., description=..., timeout=..., retries=..., strict=...,
    pure=...)`. pure=True declares the tool side-effect free: an agent may run its call the moment
    the call validates, while the model still writes the next one (pipelined tool execution)."""
    if isinstance(fn, str):
        raise ToolDefinitionError(f"@tool({fn!r}) is not supported; write @tool(name={fn!r})")

    def build(f: Callable[..., Any]) -> Tool:
        return Tool.from_function(f, name=name, description=description, timeout=timeout, retries=retries,
                                  strict=strict, pure=pure)
    return build if fn is None else build(fn)


def _check_settings(name: object, timeout: object, retries: object) -> None:
    if not isinstance(name, str) or not _NAME.match(name):
        raise ToolDefinitionError(f"tool name {name!r} is invalid: use 1-64 letters, digits, '_' "
                                  "or '-' (pass name=... to choose one)")
    if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, (int, float))
                                or not timeout > 0):
        raise ToolDefinitionError(
            f"timeout of tool {name!r} must be a positive number of seconds or None, got {timeout!r}")
    if isinstance(retries, bool) or not isinstance(retries, int) or retries < 0:
        raise ToolDefinitionError(f"retries of tool {name!r} must be an int >= 0, got {retries!r}")


def _argument_model(fn: Callable[..., Any], name: str, doc_params: Mapping[str, str], strict: bool):
    """(pydantic model, ((param, field), ...), context parameter name or None) for `fn`."""
    hints, definitions, context_param = _type_hints(fn, name), {}, None
    fields: list[tuple[str, str]] = []  # (parameter name, model field name)
    for param in _signature(fn, name).parameters.values():
        hint = _hint(param, hints, name)
        if _is_context(hint):
            context_param = param.name
            continue
        # fields get neutral internal names and the parameter name as alias, so parameters
        # such as `schema`, `json` or `model_config` cannot clash with BaseModel attributes
        field_name = f"p{len(fields)}"
        definitions[field_name] = _field(param, hint, doc_params)
        fields.append((param.name, field_name))
    return _create_model(name, definitions, strict), tuple(fields), context_param


def _create_model(name: str, definitions: dict[str, Any], strict: bool) -> type[pydantic.BaseModel]:
    config = pydantic.ConfigDict(extra="forbid", strict=strict, populate_by_name=False)
    try:
        return pydantic.create_model(f"{name}_arguments", __config__=config, **definitions)
    except (pydantic.PydanticSchemaGenerationError, pydantic.PydanticUserError, TypeError) as exc:
        raise ToolDefinitionError(
            f"tool {name!r} has a parameter type pydantic cannot validate ({exc}); use builtin "
            "types, Literal/Enum, TypedDict, dataclasses or pydantic models") from None


def _signature(fn: Callable[..., Any], name: str) -> inspect.Signature:
    try:
        return inspect.signature(fn)
    except (TypeError, ValueError) as exc:
        raise ToolDefinitionError(f"cannot read the signature of tool {name!r}: {exc}") from None


def _type_hints(fn: Callable[..., Any], name: str) -> dict[str, Any]:
    try:
        return typing.get_type_hints(_target(fn), include_extras=True)
    except Exception as exc:  # NameError for a forward reference, and friends
        raise ToolDefinitionError(
            f"cannot resolve the type hints of tool {name!r}: {exc}; define the types at module "
            "level (string annotations are resolved in the function's module)") from None


def _unwrap_partial(fn: Callable[..., Any]) -> Callable[..., Any]:
    while isinstance(fn, functools.partial):
        fn = fn.func
    return fn


def _target(fn: Callable[..., Any]) -> Callable[..., Any]:
    """What to introspect for hints and async-ness: partials unwrapped, and a callable
    object's __call__ (the hints live there, not on the instance)."""
    target = _unwrap_partial(fn)
    return target if inspect.isroutine(target) or inspect.isclass(target) else type(target).__call__


def _hint(param: inspect.Parameter, hints: Mapping[str, Any], name: str) -> Any:
    """The type hint of `param`; ToolDefinitionError for parameters a tool cannot have."""
    if param.kind is param.POSITIONAL_ONLY:
        raise ToolDefinitionError(
            f"parameter {param.name!r} of tool {name!r} is positional-only; tools are called with "
            "keyword arguments, so remove the '/' from the signature")
    if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
        stars = "*" if param.kind is param.VAR_POSITIONAL else "**"
        raise ToolDefinitionError(
            f"tool {name!r} takes {stars}{param.name}; list each argument as a named, typed "
            "parameter so it can appear in the schema")
    if param.name not in hints:
        raise ToolDefinitionError(
            f"parameter {param.name!r} of tool {name!r} has no type hint; annotate it "
            f"(e.g. `{param.name}: str`) so the model knows what to send")
    return hints[param.name]


def _field(param: inspect.Parameter, hint: Any, doc_params: Mapping[str, str]) -> tuple[Any, Any]:
    """(annotation, FieldInfo) for `param`: its default, the parameter name as alias, and the
    docstring description unless a `Field(description=...)` already gives one."""
    default = param.default
    if isinstance(default, FieldInfo):  # `x: int = Field(3, ge=0)`
        hint, default = typing.Annotated[hint, default], param.empty
    extra: dict[str, Any] = {"alias": param.name}
    if param.name in doc_params and not _annotated_description(hint):
        extra["description"] = doc_params[param.name]
    return hint, (pydantic.Field(**extra) if default is param.empty else pydantic.Field(default, **extra))


def _annotated_description(hint: Any) -> bool:
    if typing.get_origin(hint) is not typing.Annotated:
        return False
    return any(isinstance(m, FieldInfo) and m.description for m in hint.__metadata__)


def _is_context(hint: Any) -> bool:
    """True for ToolContext, a subclass, `ToolContext | None` and Annotated forms of those."""
    if typing.get_origin(hint) is typing.Annotated:
        hint = typing.get_args(hint)[0]
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        members = [a for a in typing.get_args(hint) if a is not type(None)]
        hint = members[0] if len(members) == 1 else None
    return inspect.isclass(hint) and issubclass(hint, ToolContext)


def _find_context_param(fn: Callable[..., Any]) -> str | None:
    """The ToolContext parameter of an untyped-or-typed `fn`, best effort (no hints -> None)."""
    try:
        hints = _type_hints(fn, _name_of(fn))
    except ToolDefinitionError:
        return None
    return next((p for p, h in hints.items() if p != "return" and _is_context(h)), None)


def _name_of(fn: Callable[..., Any]) -> str:
    # a user's callable: partials and callable objects have no __name__ (their type's name then)
    return getattr(fn, "__name__", type(fn).__name__)


def _is_async(fn: Callable[..., Any]) -> bool:
    return inspect.iscoroutinefunction(_target(fn))


class _NoFieldTitles(GenerateJsonSchema):
    """Schema generator without the auto-generated per-field "title" keys (noise for a model)."""

    def field_title_should_be_set(self, schema: Any) -> bool:
        return False


def _json_schema(model: type[pydantic.BaseModel], name: str) -> dict[str, Any]:
    try:
        schema = model.model_json_schema(by_alias=True, schema_generator=_NoFieldTitles)
    except pydantic.PydanticInvalidForJsonSchema as exc:
        raise ToolDefinitionError(f"tool {name!r} has a parameter with no JSON schema: {exc}") from None
    schema.pop("title", None)
    schema.setdefault("properties", {})
    return schema


def _model_validator(model: type[pydantic.BaseModel], fields: tuple[tuple[str, str], ...]) -> Validator:
    accepted = tuple(param for param, _ in fields)

    def validate(arguments: Mapping[str, Any]) -> dict[str, Any]:
        try:
            parsed = model.model_validate(arguments)
        except pydantic.ValidationError as exc:
            raise ToolCallError(describe_validation_error(exc, accepted)) from None
        return {param: getattr(parsed, field_name) for param, field_name in fields}

    return validate


def _schema_validator(tool_spec: Any) -> Validator:
    def validate(arguments: Mapping[str, Any]) -> dict[str, Any]:
        problem = tool_spec.schema_error(dict(arguments))
        if problem is not None:
            raise ToolCallError(problem)
        return dict(arguments)

    return validate
