"""Running tool calls: validation, threads for sync tools, timeouts, retries, concurrency.

Contract: `run_tool_call` / `run_tool_calls` never raise because of what a tool or the model
did. Bad arguments, unknown tools, exceptions, timeouts and unserialisable return values all
come back as a ToolResult with `is_error=True` and a message the model can act on.
Cancellation (the backend's cancelled exception) and other BaseExceptions such as
KeyboardInterrupt are never caught: they propagate to the caller.

Sync tools run in anyio worker threads bounded by `limiter` (anyio's default limiter when
None). A thread cannot be killed: on timeout or cancellation the call returns at once and the
thread is abandoned until its function returns, no longer holding a limiter token. Sync tools
that may block for long should call `anyio.from_thread.check_cancelled()` now and then; it
raises once the call has timed out or been cancelled.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import json
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

import anyio
import structlog

from agentrt import tracing
from agentrt.errors import ConfigError, ToolCallError, ToolDefinitionError
from agentrt.tools.results import ToolResult, check_max_chars, format_result
from agentrt.tools.tool import Tool, ToolContext

log = structlog.get_logger("agentrt.tools")

# (tool, or None when the name is unknown; name; arguments as a dict or JSON text; call id)
Call = tuple[Tool | None, str, Mapping[str, Any] | str, str]


class _TimedOut(Exception):
    """One attempt ran past the tool's timeout."""


async def run_tool_call(tool: Tool, arguments: Mapping[str, Any] | str, *, call_id: str,
                        context: ToolContext | None = None, limiter: anyio.CapacityLimiter | None = None,
                        max_chars: int | None = None) -> ToolResult:
    """Validate `arguments` (a dict or its JSON text), run `tool` and return its result.

    Exceptions and timeouts are retried up to `tool.retries` times; invalid arguments and a
    ToolCallError raised by the tool itself (a message meant for the model) are not. A tool is
    contained: any BaseException it raises -- SystemExit from a `sys.exit` or argparse, too --
    becomes an error result the model reads, and the agent goes on; only KeyboardInterrupt (the
    user's Ctrl-C), GeneratorExit and cancellation propagate.
    `max_chars` truncates the content (see `format_result`). With tracing on (agentrt.tracing) the
    call is an `execute_tool` span, current while the tool runs (an actor it asks continues the trace).
    """
    span = tracing.tool_call(tool.name, call_id, context.agent if context is not None else None)
    with tracing.ending(span):  # (an exception here: a broken tool definition or max_chars, the caller's bug)
        with tracing.attached(span.context):
            result = await _run_tool_call(tool, arguments, call_id, context, limiter, max_chars)
        span.add(result)
        return result


async def _run_tool_call(tool: Tool, arguments: Mapping[str, Any] | str, call_id: str, context: ToolContext | None,
                         limiter: anyio.CapacityLimiter | None, max_chars: int | None) -> ToolResult:
    started = time.perf_counter()
    check_max_chars(max_chars)  # a caller bug: raise before running anything
    try:
        kwargs = tool.validate(_parse_arguments(arguments))
    except ToolCallError as exc:
        return _error(tool.name, call_id, f"invalid arguments for tool {tool.name!r}: {exc}", 0, started)
    except ConfigError:
        raise  # a broken tool definition (e.g. an unresolvable $ref), not the model's mistake
    except Exception as exc:  # noqa: BLE001 - e.g. a custom pydantic validator raising KeyError
        message = f"validating the arguments of tool {tool.name!r} raised {type(exc).__name__}: {exc}"
        return _error(tool.name, call_id, message, 0, started)
    failure = ""
    for attempt in range(1, tool.retries + 2):
        call_kwargs = _with_context(tool, kwargs, context, call_id, attempt)
        try:
            value = await _attempt(tool, call_kwargs, limiter)
        except ToolCallError as exc:
            _log_failure(tool, call_id, attempt, exc)
            return _error(tool.name, call_id, f"tool {tool.name!r} failed: {exc}", attempt, started)
        except _TimedOut:
            failure = f"tool {tool.name!r} timed out after {tool.timeout:g}s"
            _log_failure(tool, call_id, attempt, None, failure)
        except Exception as exc:  # noqa: BLE001 - any tool failure becomes a result for the model
            failure = f"tool {tool.name!r} raised {type(exc).__name__}: {exc}"
            _log_failure(tool, call_id, attempt, exc)
        except (KeyboardInterrupt, GeneratorExit, anyio.get_cancelled_exc_class()):
            raise  # the user's Ctrl-C, a closing generator and cancellation stay what they are
        except BaseException as exc:  # noqa: BLE001 - SystemExit (argparse on bad arguments) and kin
            failure = f"tool {tool.name!r} raised {type(exc).__name__}: {exc} (the process goes on)"
            _log_failure(tool, call_id, attempt, exc)
        else:
            return _success(tool.name, call_id, value, attempt, started, max_chars)
    attempts = tool.retries + 1
    suffix = f" (gave up after {attempts} attempts)" if attempts > 1 else ""
    return _error(tool.name, call_id, failure + suffix, attempts, started)


async def run_tool_calls(calls: Sequence[Call], *, context: ToolContext | None = None,
                         limiter: anyio.CapacityLimiter | None = None, max_chars: int | None = None,
                         available: Iterable[str] = ()) -> list[ToolResult]:
    """Run the calls of one assistant message concurrently; results come back in call order.

    A call whose tool is None gets an error result naming the `available` tools. If the
    caller is cancelled, every call is cancelled and the cancellation propagates.
    """
    check_max_chars(max_chars)
    checked = [_check_call(i, call) for i, call in enumerate(calls)]
    names = tuple(available)
    results: list[ToolResult | None] = [None] * len(checked)

    async def run_one(index: int, tool: Tool, arguments: Any, call_id: str) -> None:
        results[index] = await run_tool_call(tool, arguments, call_id=call_id, context=context,
                                             limiter=limiter, max_chars=max_chars)

    async with anyio.create_task_group() as tg:
        for index, (tool, name, arguments, call_id) in enumerate(checked):
            if tool is None:
                results[index] = unknown_tool_result(name, call_id, names)
            else:
                tg.start_soon(run_one, index, tool, arguments, call_id)
    return [r for r in results if r is not None]


def unknown_tool_result(name: str, call_id: str, available: Iterable[str]) -> ToolResult:
    """The error result for a call to a tool that does not exist."""
    names = sorted(available)
    listing = f"available tools: {', '.join(names)}" if names else "no tools are available"
    content = f"unknown tool {name!r}; {listing}"
    return ToolResult(call_id=call_id, name=name, content=content, is_error=True)


class Toolset:
    """Tools by name, in the order added; names are unique (a duplicate raises ToolDefinitionError)."""

    def __init__(self, tools: Iterable[Tool | Callable[..., Any]] = ()) -> None:
        self._tools: dict[str, Tool] = {}
        for item in tools:
            self.add(item)

    def add(self, item: Tool | Callable[..., Any]) -> Tool:
        """Add a Tool (a plain function is turned into one with `Tool.from_function`)."""
        added = item if isinstance(item, Tool) else Tool.from_function(item)
        if added.name in self._tools:
            raise ToolDefinitionError(
                f"a tool named {added.name!r} is already registered; tool names must be unique")
        self._tools[added.name] = added
        return added

    def get(self, name: str) -> Tool | None:
        return self._tools.get(name)

    def __getitem__(self, name: str) -> Tool:
        return self._tools[name]

    def __contains__(self, name: object) -> bool:
        return name in self._tools

    def __iter__(self) -> Iterator[Tool]:
        return iter(self._tools.values())

    def __len__(self) -> int:
        return len(self._tools)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(self._tools)

    def openai_schemas(self) -> list[dict[str, Any]]:
        """Every tool's `openai_schema()`, e.g. for a chat template or `ToolCallParser`."""
        return [t.openai_schema() for t in self._tools.values()]

    async def run_calls(self, calls: Sequence[tuple[str, Mapping[str, Any] | str, str]],
                        **options: Any) -> list[ToolResult]:
        """`run_tool_calls` for (name, arguments, call_id) triples, resolving names here."""
        resolved = [(self.get(name), name, arguments, call_id) for name, arguments, call_id in calls]
        return await run_tool_calls(resolved, available=self.names, **options)


def _check_call(index: int, call: Any) -> Call:
    if not isinstance(call, tuple) or len(call) != 4 or not (call[0] is None or isinstance(call[0], Tool)):
        raise ConfigError(
            f"calls[{index}] must be a (Tool | None, name, arguments, call_id) tuple, got {call!r}")
    return call


def _parse_arguments(arguments: Mapping[str, Any] | str) -> Mapping[str, Any]:
    """The arguments object; JSON text is decoded ("" counts as no arguments)."""
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except json.JSONDecodeError as exc:
            raise ToolCallError(f"arguments are not valid JSON ({exc.msg} at position {exc.pos})") from None
    if not isinstance(arguments, Mapping):
        raise ToolCallError(f"arguments must be a JSON object, got {type(arguments).__name__}")
    return arguments


def _with_context(tool: Tool, kwargs: dict[str, Any], context: ToolContext | None, call_id: str,
                  attempt: int) -> dict[str, Any]:
    if tool.context_param is None:
        return kwargs
    base = context or ToolContext()
    ctx = dataclasses.replace(base, call_id=call_id, tool_name=tool.name, attempt=attempt)
    return {**kwargs, tool.context_param: ctx}


async def _attempt(tool: Tool, kwargs: dict[str, Any], limiter: anyio.CapacityLimiter | None) -> Any:
    """One invocation under the tool's timeout; raises _TimedOut when it runs past it."""
    with anyio.move_on_after(tool.timeout):
        if tool.is_async:
            value = await tool.fn(**kwargs)
        else:
            call = functools.partial(tool.fn, **kwargs)
            value = await anyio.to_thread.run_sync(call, abandon_on_cancel=True, limiter=limiter)
        if inspect.isawaitable(value):  # a sync wrapper around an async function
            value = await value
        return value
    raise _TimedOut


def _success(name: str, call_id: str, value: Any, attempts: int, started: float,
             max_chars: int | None) -> ToolResult:
    try:
        content, is_error = format_result(value, max_chars=max_chars), False
    except ToolCallError as exc:
        content, is_error = str(exc), True
    return ToolResult(call_id=call_id, name=name, content=content, is_error=is_error, raw=value,
                      attempts=attempts, duration_s=time.perf_counter() - started)


def _log_failure(tool: Tool, call_id: str, attempt: int, exc: BaseException | None, message: str = "") -> None:
    """Every time a tool raises or times out, for the developer (the model reads the result):
    the tool, the call, the attempt and the exception with its traceback."""
    log.warning("tool.failed", tool=tool.name, call_id=call_id, attempt=attempt, of=tool.retries + 1,
                error=message or f"{type(exc).__name__}: {exc}", exc_info=exc)


def _error(name: str, call_id: str, message: str, attempts: int, started: float) -> ToolResult:
    return ToolResult(call_id=call_id, name=name, content=message, is_error=True, attempts=attempts,
                      duration_s=time.perf_counter() - started)
