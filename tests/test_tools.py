"""agentrt.tools: schemas from typed functions, and a dispatcher that never crashes its caller."""

import dataclasses
import datetime as dt
import enum
import functools
import json
import threading
import uuid
from decimal import Decimal
from pathlib import Path
from typing import Annotated, Literal, Optional

import anyio
import pydantic
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agentrt.errors import ConfigError, ToolCallError, ToolDefinitionError
from agentrt.toolcall import load_tool_specs
from agentrt.tools import (
    Tool,
    ToolContext,
    Toolset,
    format_result,
    parse_docstring,
    run_tool_call,
    run_tool_calls,
    tool,
)


class Filters(pydantic.BaseModel):
    tags: list[str]
    min_score: float = 0.0


class Color(enum.Enum):
    RED = "red"
    BLUE = "blue"


class Opaque:
    pass


@tool
def search(query: str, ids: list[int], filters: Filters, color: Color,
           mode: Literal["fast", "deep"] = "fast", limit: Optional[int] = None,
           note: Annotated[str, pydantic.Field(description="from Field")] = "",
           ctx: ToolContext = None) -> dict:
    """Search the notes.

    Matches words and tags.

    Args:
        query: words to look for
        ids (list[int]): note ids to
            search in
        note: from the docstring (Field wins)

    Returns:
        the matches
    """
    return {"query": query, "ids": ids, "filters": filters, "call_id": ctx.call_id, "deps": ctx.deps}


GOOD = {"query": "q", "ids": [1, "2"], "filters": {"tags": ["a"]}, "color": "red"}


def run(fn):
    return anyio.run(fn)


def call(t, arguments, **options):
    return run(lambda: run_tool_call(t, arguments, call_id="c1", **options))


def blocking_tool(**options):
    """A sync tool that blocks until released, polling anyio's cancellation check."""
    entered, exited = threading.Event(), threading.Event()

    def blocking() -> str:
        entered.set()
        try:
            while not exited.wait(0.01):
                anyio.from_thread.check_cancelled()  # raises once the call timed out / was cancelled
            return "released"
        finally:
            exited.set()

    return Tool.from_function(blocking, **options), entered, exited


def test_schema_from_hints_and_docstring():
    schema = search.openai_schema()
    function = schema["function"]
    assert schema["type"] == "function" and function["name"] == "search"
    assert function["description"] == "Search the notes.\n\nMatches words and tags."
    params = function["parameters"]
    props = params["properties"]
    assert set(props) == {"query", "ids", "filters", "color", "mode", "limit", "note"}  # no ctx
    assert params["required"] == ["query", "ids", "filters", "color"]
    assert params["additionalProperties"] is False and "title" not in params
    assert props["query"] == {"type": "string", "description": "words to look for"}
    assert props["ids"] == {"type": "array", "items": {"type": "integer"},
                            "description": "note ids to search in"}
    assert props["mode"] == {"type": "string", "enum": ["fast", "deep"], "default": "fast"}
    assert props["limit"]["default"] is None and {"type": "null"} in props["limit"]["anyOf"]
    assert props["note"]["description"] == "from Field"
    assert params["$defs"]["Color"]["enum"] == ["red", "blue"]
    # the $refs resolve: the project's JSON-schema validator follows them into nested values
    spec = load_tool_specs([schema])["search"]
    exact = GOOD | {"ids": [1, 2]}
    assert spec.schema_error(exact) is None
    assert "$.filters.tags[0]" in spec.schema_error(exact | {"filters": {"tags": [3]}})
    schema["function"]["parameters"]["properties"].clear()
    assert search.parameters["properties"], "openai_schema() returns a copy"


@pytest.mark.parametrize("doc", [
    "Add numbers.\n\nArgs:\n    a: first\n        number\n    b (int, optional): second\n\n"
    "Returns:\n    sum\n",
    "Add numbers.\n\nParameters\n----------\na : int\n    first\n    number\nb : int, optional\n"
    "    second\n\nReturns\n-------\nint\n",
    "Add numbers.\n\n:param a: first\n    number\n:param int b: second\n:returns: sum\n",
])
def test_docstring_styles(doc):
    assert parse_docstring(doc) == ("Add numbers.", {"a": "first number", "b": "second"})


def test_validation_errors_are_short_and_name_the_field():
    bad = {"query": 3, "ids": ["x"], "filters": {"tags": [1]}, "color": "green", "extra": 1}
    result = call(search, bad)
    assert result.is_error and result.attempts == 0 and result.raw is None
    assert result.content.startswith("invalid arguments for tool 'search': ")
    for fragment in ["query: Input should be a valid string (got 3)", "ids[0]: ", "filters.tags[0]: ",
                     "color: Input should be 'red' or 'blue'",
                     "extra: unexpected argument (this tool takes: query, ids, filters"]:
        assert fragment in result.content
    assert "http" not in result.content and "pydantic" not in result.content
    assert "query: missing required argument" in call(search, {}).content
    assert "not valid JSON" in call(search, "{nope").content
    assert "must be a JSON object" in call(search, "[1]").content
    assert "raised KeyError: 'k'" in call(tool(name="v")(_picky_validator), {"s": {"k": 1}}).content


class Picky(pydantic.BaseModel):
    k: int

    @pydantic.field_validator("k")
    @classmethod
    def explode(cls, value: int) -> int:
        raise KeyError("k")  # not a ValueError: pydantic lets it through


def _picky_validator(s: Picky) -> int:
    return s.k


def test_valid_call_coerces_injects_context_and_formats_json():
    result = call(search, json.dumps(GOOD), context=ToolContext(agent="a", deps={"db": 1}))
    assert not result.is_error and result.attempts == 1 and result.duration_s >= 0
    assert result.raw["ids"] == [1, 2] and result.raw["filters"] == Filters(tags=["a"])
    assert json.loads(result.content) == {"query": "q", "ids": [1, 2], "call_id": "c1", "deps": {"db": 1},
                                          "filters": {"tags": ["a"], "min_score": 0.0}}
    assert result.to_message() == {"role": "tool", "tool_call_id": "c1", "name": "search",
                                   "content": result.content}


def test_strict_mode_turns_off_coercion():
    strict = tool(strict=True)(_double.fn)
    assert "Input should be a valid integer (got '2')" in call(strict, {"x": "2"}).content
    assert call(_double, {"x": "2"}).raw == 4


class Service:
    async def __call__(self, word: str) -> str:
        return word * 2

    def add(self, x: int, ctx: Optional[ToolContext] = None) -> str:
        """Add the tool name's length."""
        return f"{x + len(ctx.tool_name)}"


def test_methods_callable_objects_and_partials():
    method = Tool.from_function(Service().add)
    obj = Tool.from_function(Service(), name="echo")
    part = Tool.from_function(functools.partial(_double.fn, x=5), name="five")
    assert (method.description, method.context_param, list(method.parameters["properties"])) == \
        ("Add the tool name's length.", "ctx", ["x"])
    assert obj.is_async and not method.is_async
    assert [call(method, {"x": 1}).content, call(obj, {"word": "ab"}).content, call(part, {}).content] \
        == ["4", "abab", "10"]


def test_sync_tools_run_in_threads_and_async_tools_on_the_loop():
    def where() -> int:
        return threading.get_ident()

    async def where_async() -> int:
        return threading.get_ident()

    loop_thread = threading.get_ident()  # anyio.run runs the event loop in this thread
    assert call(Tool.from_function(where), {}).raw != loop_thread
    assert call(Tool.from_function(where_async), {}).raw == loop_thread


def test_capacity_limiter_bounds_sync_concurrency():
    lock, state = threading.Lock(), {"now": 0, "max": 0}
    barrier = threading.Barrier(2, timeout=5)  # proves that two calls do overlap

    def work(i: int) -> int:
        with lock:
            state["now"] += 1
            state["max"] = max(state["max"], state["now"])
        barrier.wait()
        with lock:
            state["now"] -= 1
        return i

    t = Tool.from_function(work)
    calls = [(t, "work", {"i": i}, f"c{i}") for i in range(6)]
    results = run(lambda: run_tool_calls(calls, limiter=anyio.CapacityLimiter(2)))
    assert [r.raw for r in results] == list(range(6)) and state["max"] == 2


def test_calls_run_concurrently_and_results_keep_call_order():
    async def main():
        ready = anyio.Event()

        async def waiter() -> str:
            await ready.wait()  # would hang unless setter runs while this call is pending
            return "waited"

        async def setter() -> str:
            ready.set()
            return "set"

        a, b = Tool.from_function(waiter), Tool.from_function(setter)
        calls = [(a, "waiter", {}, "1"), (None, "nope", {}, "2"), (b, "setter", {}, "3")]
        with anyio.fail_after(5):
            return await run_tool_calls(calls, available=["waiter", "setter"])

    results = run(main)
    assert [r.call_id for r in results] == ["1", "2", "3"]
    assert [r.content for r in results[::2]] == ["waited", "set"]
    assert results[1].is_error
    assert results[1].content == "unknown tool 'nope'; available tools: setter, waiter"


def test_timeout_cancels_async_tool_and_is_retried():
    cancelled = []

    @tool(timeout=0.05, retries=1)
    async def slow(ctx: ToolContext) -> str:
        try:
            await anyio.sleep(30 if ctx.attempt == 1 else 0)
        except anyio.get_cancelled_exc_class():
            cancelled.append(ctx.attempt)
            raise
        return "second try"

    result = call(slow, {})
    assert (result.content, result.attempts, cancelled) == ("second try", 2, [1])


def test_timeout_abandons_sync_tool_which_sees_the_cancellation():
    blocking, _, exited = blocking_tool(timeout=0.05)
    result = call(blocking, {})
    assert result.is_error and result.content == "tool 'blocking' timed out after 0.05s"
    assert exited.wait(5), "the worker thread must not stay blocked"


def test_exceptions_become_error_results_and_are_retried():
    attempts = []

    @tool(retries=2)
    def flaky(ctx: ToolContext) -> str:
        attempts.append(ctx.attempt)
        if len(attempts) < 3:
            raise ConnectionError("try again")
        return "ok"

    result = call(flaky, {})
    assert (result.content, result.is_error, result.attempts, attempts) == ("ok", False, 3, [1, 2, 3])

    @tool(retries=1)
    def broken() -> str:
        raise ValueError("boom")

    result = call(broken, {})
    assert result.is_error and result.attempts == 2
    assert result.content == "tool 'broken' raised ValueError: boom (gave up after 2 attempts)"


def test_tool_call_error_and_invalid_arguments_are_not_retried():
    runs = []

    @tool(retries=3)
    def picky(x: int) -> str:
        runs.append(x)
        raise ToolCallError("x must be even")

    assert call(picky, {"x": "nan"}).attempts == 0 and runs == []
    result = call(picky, {"x": 1})
    assert (result.content, result.attempts, runs) == ("tool 'picky' failed: x must be even", 1, [1])


def test_unserialisable_result_is_an_error_result():
    result = call(tool(name="bad")(lambda: {"thing": Opaque()}), {})
    assert result.is_error and isinstance(result.raw["thing"], Opaque)
    assert "object of type Opaque that cannot be turned into text" in result.content


class Stop(BaseException):
    pass


def test_other_base_exceptions_are_contained():
    """Any BaseException a tool raises (but Ctrl-C, GeneratorExit and cancellation) is the tool's
    failure, not the process's (issue 30: a careless tool must not end the event loop)."""
    @tool
    async def interrupt() -> str:
        raise Stop

    result = call(interrupt, {})
    assert result.is_error and "raised Stop" in result.content


def test_cancelling_run_tool_calls_propagates_and_frees_threads():
    blocking, entered, exited = blocking_tool()

    @tool
    async def sleepy() -> None:
        await anyio.sleep(30)

    async def main():
        finished = None
        with anyio.CancelScope() as scope:
            async with anyio.create_task_group() as tg:
                async def cancel_once_entered():
                    await anyio.to_thread.run_sync(entered.wait, 5)
                    scope.cancel()

                tg.start_soon(cancel_once_entered)
                calls = [(blocking, "blocking", {}, "1"), (sleepy, "sleepy", {}, "2")]
                finished = await run_tool_calls(calls)
        return scope.cancelled_caught, finished

    assert run(main) == (True, None)
    assert exited.wait(5), "the cancelled sync tool's thread must finish"


def _no_hint(x):
    return x


def _var_args(*items: int):
    return items


def _var_kwargs(**items: int):
    return items


def _positional(x: int, /):
    return x


def _forward(x: "Missing"):  # noqa: F821 - deliberately unresolvable
    return x


def _arbitrary(x: Opaque):
    return x


@pytest.mark.parametrize("make,fragment", [
    (lambda: tool(_no_hint), "'x' of tool '_no_hint' has no type hint"),
    (lambda: tool(_var_args), "takes *items"),
    (lambda: tool(_var_kwargs), "takes **items"),
    (lambda: tool(_positional), "positional-only"),
    (lambda: tool(_forward), "cannot resolve the type hints"),
    (lambda: tool(_arbitrary), "pydantic cannot validate"),
    (lambda: tool(lambda x: x), "tool name '<lambda>' is invalid"),
    (lambda: tool("named"), "@tool(name='named')"),
    (lambda: tool(timeout=0)(search.fn), "timeout of tool 'search'"),
    (lambda: tool(retries=-1)(search.fn), "retries of tool 'search'"),
    (lambda: Tool.from_function(42), "needs a plain callable"),
    (lambda: Toolset([search, search]), "already registered"),
    (lambda: Tool.from_openai({"name": "t", "parameters": {"type": "string"}}, print), "bad OpenAI tool"),
])
def test_bad_definitions_raise_tool_definition_error(make, fragment):
    with pytest.raises(ToolDefinitionError) as info:
        make()
    assert fragment in str(info.value)


def _add_with_context(a, ctx: ToolContext):
    return a + len(ctx.tool_name)


def test_from_openai_validates_with_the_json_schema():
    spec = {"type": "function", "function": {"name": "add", "description": "Add.", "parameters": {
        "type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}}}
    assert Tool.from_openai(spec, lambda a: a).context_param is None
    add = Tool.from_openai(spec, _add_with_context)
    assert add.openai_schema() == spec and add.context_param == "ctx"
    assert call(add, {"a": 1}).raw == 4
    assert "violate the schema" in call(add, {"a": "1"}).content  # JSON schema: no coercion


@tool
def _double(x: int) -> int:
    return 2 * x


def test_toolset_lookup_schemas_and_run_calls():
    tools = Toolset([search])
    assert tools.add(_double) is _double
    assert tools.names == ("search", "_double") and tools.get("x") is None and "search" in tools
    assert [s["function"]["name"] for s in tools.openai_schemas()] == ["search", "_double"]
    results = run(lambda: tools.run_calls([("_double", {"x": 2}, "a"), ("zap", {}, "b")]))
    assert results[0].raw == 4 and "available tools: _double, search" in results[1].content
    assert _double(3) == 6 and tools["_double"](3) == 6  # a Tool stays callable from Python


@dataclasses.dataclass
class Point:
    x: int
    when: dt.date


def test_format_result_handles_common_types():
    value = {"p": Point(1, dt.date(2024, 1, 2)), "u": uuid.UUID(int=1), "d": Decimal("1.10"),
             "path": Path("/a"), "e": Color.BLUE, "s": {3, 1}, "utf8": "é".encode(), "bin": b"\xff",
             "t": dt.datetime(2024, 1, 2, 3), "m": Filters(tags=["x"])}
    assert json.loads(format_result(value)) == {
        "p": {"x": 1, "when": "2024-01-02"}, "u": "00000000-0000-0000-0000-000000000001", "d": "1.10",
        "path": "/a", "e": "blue", "s": [1, 3], "utf8": "é", "bin": "base64:/w==",
        "t": "2024-01-02T03:00:00", "m": {"tags": ["x"], "min_score": 0.0}}
    assert format_result("plain ü") == "plain ü" and format_result(None) == "null"
    assert format_result(Filters(tags=[])) == '{"tags":[],"min_score":0.0}'
    assert format_result("x" * 10, max_chars=4) == "xxxx\n…[truncated: showing 4 of 10 characters]"
    loop: list = []
    loop.append(loop)
    with pytest.raises(ToolCallError, match="cannot be turned into JSON"):
        format_result(loop)
    with pytest.raises(ConfigError):
        format_result("x", max_chars=0)


json_values = st.recursive(st.none() | st.booleans() | st.integers() | st.text(),
                           lambda inner: st.lists(inner) | st.dictionaries(st.text(), inner), max_leaves=20)


@settings(max_examples=50, deadline=None)
@given(json_values)
def test_format_result_round_trips_json_values(value):
    text = format_result(value)
    assert text == value if isinstance(value, str) else json.loads(text) == value


def test_a_tool_calling_sys_exit_is_contained_and_ctrl_c_is_not():
    """A careless tool (argparse exits on bad arguments) becomes an error result the model can
    read -- sync (in a worker thread) or async -- and the event loop goes on; KeyboardInterrupt
    still propagates as the user's Ctrl-C."""
    import sys

    @tool
    def cli(args: str) -> str:
        """Run a command line."""
        sys.exit(2)

    @tool
    async def acli(args: str) -> str:
        """Run a command line, async."""
        raise SystemExit("usage: acli ARGS")

    for t in (cli, acli):
        res = run(lambda: run_tool_call(t, {"args": "--bad"}, call_id="c1"))
        assert res.is_error and "SystemExit" in res.content and t.name in res.content
    @tool
    def inc(x: int) -> int:
        """Add one."""
        return x + 1

    ok = run(lambda: run_tool_call(inc, {"x": 1}, call_id="c2"))
    assert not ok.is_error and ok.content == "2"  # (the loop is alive)

    @tool
    def interrupted(x: int) -> int:
        """Interrupted."""
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run(lambda: run_tool_call(interrupted, {"x": 1}, call_id="c3"))
