"""OpenTelemetry traces (agentrt.tracing) with the SDK's in-memory exporter: the span tree of a
two-agent handoff with tool calls, of a LangGraph run, and of a server request (W3C traceparent
in and out); the GenAI attribute names against opentelemetry-semantic-conventions; nothing
traced (and OpenTelemetry not imported) while off."""

from __future__ import annotations

import subprocess
import sys
from typing import Literal

import anyio
import pytest

pytest.importorskip("opentelemetry.sdk")

import agentrt  # noqa: E402
from agentrt import Agent, Engine, EngineConfig, Runtime, SamplingParams, tool, tracing  # noqa: E402
from agentrt.errors import ConfigError  # noqa: E402
from agentrt.tracing import attributes as A  # noqa: E402
from tests.conftest import tiny_native_with_tokenizer  # noqa: E402
from tests.tracing_util import named, parent_of, tree  # noqa: E402

CFG = EngineConfig(kv_cache_tokens=4096)


# ---- a two-agent handoff with tool calls -------------------------------------------------------
def _handoff(provider) -> agentrt.TurnResult:
    holder: dict = {}

    @tool
    async def delegate(task: Literal["sum"]) -> str:
        """Hand the task to the worker agent."""
        return (await holder["worker"].ask(f"do {task}", timeout=60)).text

    async def main():
        outer = provider.get_tracer("test")
        async with Engine(tiny_native_with_tokenizer(), CFG) as eng, Runtime(eng) as rt:
            holder["worker"] = await rt.spawn(Agent("worker", "You work.", settings=SamplingParams(max_tokens=6)))
            lead = await rt.spawn(Agent("lead", "Call delegate.", [delegate], tool_choice="required",
                                        max_tool_rounds=1, settings=SamplingParams(max_tokens=48)))
            with outer.start_as_current_span("request"):
                return await lead.ask("go", timeout=120)
    return anyio.run(main)


def test_a_two_agent_handoff_is_one_tree(spans):
    exporter, provider = spans
    result = _handoff(provider)
    by_id, kids = tree(exporter)
    assert result.tool_results and all(not r.is_error for r in result.tool_results), result.tool_results
    (request,) = named(exporter, "request")
    (lead,) = named(exporter, "invoke_agent lead")
    assert parent_of(lead, by_id) is request
    # the lead's turn: round 0 (the calls), the tools, round 1 (the answer)
    lead_chats = [s for s in named(exporter, "chat ") if parent_of(s, by_id) is lead]
    tools = named(exporter, "execute_tool delegate")
    assert len(lead_chats) == result.rounds == 2
    assert len(tools) == len(result.tool_results) >= 1
    assert all(parent_of(t, by_id) is lead for t in tools)
    assert kids[lead.context.span_id][0].startswith("chat ") and kids[lead.context.span_id][-1].startswith("chat ")
    # each tool call asked the worker: the worker's turn is a child of that tool's span
    workers = named(exporter, "invoke_agent worker")
    assert len(workers) == len(tools)
    assert sorted(parent_of(w, by_id).context.span_id for w in workers) == sorted(t.context.span_id for t in tools)
    for w in workers:
        (chat,) = [s for s in named(exporter, "chat ") if parent_of(s, by_id) is w]
        assert chat.attributes[A.OPERATION] == "chat"
    # one trace id for all of it
    assert {s.context.trace_id for s in exporter.get_finished_spans()} == {request.context.trace_id}
    _check_attributes(lead, lead_chats, tools, result)


def _check_attributes(lead, chats, tools, result) -> None:
    la = lead.attributes
    assert la[A.OPERATION] == "invoke_agent" and la[A.AGENT_NAME] == "lead"
    assert la[A.REQUEST_MODEL] == "tiny-random-int8" and la[A.PROVIDER] == "agentrt"
    assert la[A.TURN_ROUNDS] == 2 and la[A.TURN_TOOL_CALLS] == len(tools)
    assert la[A.INPUT_TOKENS] == sum(u.prompt_tokens for u in result.usage)
    assert la[A.OUTPUT_TOKENS] == sum(u.completion_tokens for u in result.usage)
    assert A.TASK_ID in la
    first, second = chats
    assert tuple(first.attributes[A.FINISH_REASONS]) == ("tool_calls",)
    assert tuple(second.attributes[A.FINISH_REASONS]) in (("stop",), ("length",))
    for chat, usage in zip(chats, result.usage):
        ca = chat.attributes
        assert chat.name == "chat tiny-random-int8" and ca[A.REQUEST_MAX_TOKENS] == 48
        assert ca[A.INPUT_TOKENS] == usage.prompt_tokens and ca[A.OUTPUT_TOKENS] == usage.completion_tokens
        assert ca[A.CACHE_READ_TOKENS] == ca[A.PREFILL_REUSED] == usage.cached_tokens
        assert ca[A.PREFILL_COMPUTED] == usage.computed_prompt_tokens
        assert ca[A.QUEUE_WAIT] >= 0 and ca[A.POLICY] == "fcfs" and ca[A.OVERTOOK] == 0
        assert ca[A.KV_PROMOTED] == 0 and ca[A.PREEMPTIONS] == 0
    # round 1 reuses round 0's KV (the session): most of its prompt is a cache read
    assert second.attributes[A.CACHE_READ_TOKENS] >= first.attributes[A.INPUT_TOKENS]
    for t, r in zip(tools, result.tool_results):
        ta = t.attributes
        assert ta[A.OPERATION] == "execute_tool" and ta[A.TOOL_NAME] == "delegate" and ta[A.TOOL_TYPE] == "function"
        assert ta[A.TOOL_CALL_ID] == r.call_id and ta[A.TOOL_AGENT] == "lead" and ta[A.TOOL_ATTEMPTS] == 1
        assert A.ERROR_TYPE not in ta


def test_a_tool_error_marks_its_span(spans):
    exporter, _ = spans

    @tool
    def broken(what: Literal["x"]) -> str:
        """Always fails."""
        raise RuntimeError("boom")

    async def main():
        async with Engine(tiny_native_with_tokenizer(), CFG) as eng, Runtime(eng) as rt:
            a = await rt.spawn(Agent("a", "Call broken.", [broken], tool_choice="required", max_tool_rounds=1,
                                     settings=SamplingParams(max_tokens=48)))
            return await a.ask("go", timeout=120)
    result = anyio.run(main)
    spans_ = named(exporter, "execute_tool broken")
    assert spans_ and len(spans_) == len(result.tool_results)
    assert all(s.attributes[A.ERROR_TYPE] == "tool_error" for s in spans_)


# ---- off: nothing ------------------------------------------------------------------------------
def test_off_makes_no_spans_and_hands_out_no_span_objects(spans):
    exporter, provider = spans
    tracing.disable()
    assert not tracing.is_enabled()
    assert tracing.agent_turn("a", None) is tracing.NO_SPAN and tracing.capture() is None
    assert tracing.chat(None, SamplingParams()) is tracing.NO_SPAN and tracing.headers(object()) == {}
    _handoff(provider)
    assert [s.name for s in exporter.get_finished_spans()] == ["request"]  # the test's own span only


def test_importing_and_running_agentrt_does_not_import_opentelemetry():
    code = ("import sys, agentrt, agentrt.runtime.agent, agentrt.tools.dispatch, agentrt.conversation.conversation\n"
            "from agentrt import tracing\n"
            "assert tracing.tool_call('t', 'c', 'a') is tracing.NO_SPAN\n"
            "print(sorted(m for m in sys.modules if m.startswith('opentelemetry')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_enable_checks_its_argument_and_says_how_to_install(monkeypatch):
    with pytest.raises(ConfigError, match="TracerProvider"):
        tracing.enable(object())
    assert not tracing.is_enabled()
    monkeypatch.setitem(sys.modules, "agentrt.tracing.spans", None)  # as without the otel extra
    with pytest.raises(ConfigError, match=r"agentrt\[otel\]"):
        tracing.enable()
    assert not tracing.is_enabled()


def test_the_global_tracer_provider_is_honoured_even_when_set_after_enable():
    code = """
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from agentrt import tracing
tracing.enable()
exporter, provider = InMemorySpanExporter(), TracerProvider()
provider.add_span_processor(SimpleSpanProcessor(exporter))
trace.set_tracer_provider(provider)
tracing.tool_call("t", "call_1", None).end()
print([s.name for s in exporter.get_finished_spans()])
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "['execute_tool t']"


def test_attribute_names_follow_the_genai_semantic_conventions():
    g = pytest.importorskip("opentelemetry.semconv._incubating.attributes.gen_ai_attributes")
    ours = {"GEN_AI_OPERATION_NAME": A.OPERATION, "GEN_AI_PROVIDER_NAME": A.PROVIDER,
            "GEN_AI_AGENT_NAME": A.AGENT_NAME, "GEN_AI_REQUEST_MODEL": A.REQUEST_MODEL,
            "GEN_AI_REQUEST_MAX_TOKENS": A.REQUEST_MAX_TOKENS, "GEN_AI_REQUEST_TEMPERATURE": A.REQUEST_TEMPERATURE,
            "GEN_AI_REQUEST_TOP_P": A.REQUEST_TOP_P, "GEN_AI_REQUEST_TOP_K": A.REQUEST_TOP_K,
            "GEN_AI_REQUEST_SEED": A.REQUEST_SEED, "GEN_AI_USAGE_INPUT_TOKENS": A.INPUT_TOKENS,
            "GEN_AI_USAGE_OUTPUT_TOKENS": A.OUTPUT_TOKENS, "GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS": A.CACHE_READ_TOKENS,
            "GEN_AI_RESPONSE_FINISH_REASONS": A.FINISH_REASONS, "GEN_AI_TOOL_NAME": A.TOOL_NAME,
            "GEN_AI_TOOL_CALL_ID": A.TOOL_CALL_ID, "GEN_AI_TOOL_TYPE": A.TOOL_TYPE}
    assert {k: getattr(g, k, None) for k in ours} == ours
    ops = {v.value for v in g.GenAiOperationNameValues}
    assert {"invoke_agent", "chat", "execute_tool"} <= ops


def test_agentrt_serve_trace_enables_tracing(monkeypatch):
    import agentrt.cli as cli
    import agentrt.server as server

    served = []
    monkeypatch.setattr(cli, "_load", lambda args: "model")
    monkeypatch.setattr(server, "serve", lambda *a, **kw: served.append(tracing.is_enabled()))
    try:
        assert cli.main(["serve", "--trace", "--port", "0"]) == 0
        tracing.disable()
        assert cli.main(["serve", "--port", "0"]) == 0
    finally:
        tracing.disable()
    assert served == [True, False]


def test_log_lines_name_the_actor_task_and_span(spans):
    """structlog's context holds the actor and task while a message is handled; add_trace_ids
    joins a line to the span current where it was logged (here: the tool call's)."""
    import structlog
    from structlog.contextvars import merge_contextvars

    exporter, _ = spans
    log = structlog.get_logger("test")

    @tool
    async def note(what: Literal["x"]) -> str:
        """Write a log line."""
        log.info("tool ran")
        return "ok"

    async def main():
        async with Engine(tiny_native_with_tokenizer(), CFG) as eng, Runtime(eng) as rt:
            a = await rt.spawn(Agent("a", "Call note.", [note], tool_choice="required", max_tool_rounds=1,
                                     settings=SamplingParams(max_tokens=48)))
            with structlog.testing.capture_logs(processors=[merge_contextvars, tracing.add_trace_ids]) as logs:
                await a.ask("go", timeout=120, workflow="wf")
            return logs
    logs = [e for e in anyio.run(main) if e["event"] == "tool ran"]
    tools = named(exporter, "execute_tool note")
    assert logs and len(logs) == len(tools)
    assert {e["actor"] for e in logs} == {"a"} and all(e["task"] for e in logs)
    assert sorted(e["span_id"] for e in logs) == sorted(format(t.context.span_id, "016x") for t in tools)
    assert {e["trace_id"] for e in logs} == {format(tools[0].context.trace_id, "032x")}
    tracing.disable()
    assert tracing.add_trace_ids(None, "info", {"event": "e"}) == {"event": "e"}


def test_usage_attributes_carry_the_engines_numbers():
    u = agentrt.Usage(100, 60, 40, 7, queue_wait_s=0.25, preemptions=1, spec_proposed=8, spec_accepted=6,
                      promoted_tokens=32, promote_s=0.002, overtook=3)
    a = A.usage_attributes(u)
    assert (a[A.INPUT_TOKENS], a[A.CACHE_READ_TOKENS], a[A.PREFILL_COMPUTED], a[A.OUTPUT_TOKENS]) == (100, 60, 40, 7)
    assert (a[A.QUEUE_WAIT], a[A.PREEMPTIONS], a[A.OVERTOOK]) == (0.25, 1, 3)
    assert (a[A.KV_PROMOTED], a[A.KV_PROMOTE_S]) == (32, 0.002)
    assert (a[A.SPEC_PROPOSED], a[A.SPEC_ACCEPTED], a[A.SPEC_ACCEPTANCE]) == (8, 6, 0.75)
    assert A.SPEC_ACCEPTANCE not in A.usage_attributes(agentrt.Usage(1, 0, 1, 1))  # (no drafts: no rate)
