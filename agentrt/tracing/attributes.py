"""Span attributes: the OpenTelemetry GenAI semantic conventions' names, agentrt's own
(`agentrt.*`), and the pure functions that read them off agentrt's results. No OpenTelemetry
import here (tests check the names against opentelemetry-semantic-conventions)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

# ---- GenAI semantic conventions (gen_ai_attributes in opentelemetry-semantic-conventions) ------
OPERATION = "gen_ai.operation.name"  # "invoke_agent" | "chat" | "execute_tool"
PROVIDER = "gen_ai.provider.name"
AGENT_NAME = "gen_ai.agent.name"
REQUEST_MODEL = "gen_ai.request.model"
REQUEST_MAX_TOKENS = "gen_ai.request.max_tokens"
REQUEST_TEMPERATURE = "gen_ai.request.temperature"
REQUEST_TOP_P = "gen_ai.request.top_p"
REQUEST_TOP_K = "gen_ai.request.top_k"
REQUEST_SEED = "gen_ai.request.seed"
INPUT_TOKENS = "gen_ai.usage.input_tokens"
OUTPUT_TOKENS = "gen_ai.usage.output_tokens"
CACHE_READ_TOKENS = "gen_ai.usage.cache_read.input_tokens"  # included in input_tokens
FINISH_REASONS = "gen_ai.response.finish_reasons"
TOOL_NAME = "gen_ai.tool.name"
TOOL_CALL_ID = "gen_ai.tool.call.id"
TOOL_TYPE = "gen_ai.tool.type"
ERROR_TYPE = "error.type"
HTTP_METHOD = "http.request.method"
HTTP_STATUS = "http.response.status_code"
HTTP_ROUTE = "http.route"
URL_PATH = "url.path"

PROVIDER_NAME = "agentrt"  # the model runs in this process: agentrt is the provider

# ---- agentrt's own ---------------------------------------------------------------------------
PREFILL_COMPUTED = "agentrt.prefill.computed_tokens"  # prompt tokens prefilled (recompute included)
PREFILL_REUSED = "agentrt.prefill.reused_tokens"  # prompt tokens served from KV held (= cache_read)
QUEUE_WAIT = "agentrt.queue.wait_s"  # submission -> (latest) admission
PREEMPTIONS = "agentrt.preemptions"
KV_PROMOTED = "agentrt.kv.promoted_tokens"  # prompt tokens copied back from the KV tier
KV_PROMOTE_S = "agentrt.kv.promote_s"  # ... their copy time (the tier's measured cost per page)
SPEC_PROPOSED = "agentrt.speculation.proposed_tokens"
SPEC_ACCEPTED = "agentrt.speculation.accepted_tokens"
SPEC_ACCEPTANCE = "agentrt.speculation.acceptance"  # accepted / proposed (only when proposed)
POLICY = "agentrt.scheduling.policy"  # EngineConfig.scheduling_policy
OVERTOOK = "agentrt.scheduling.overtook"  # earlier arrivals the policy admitted it before
ENGINE_FINISH = "agentrt.round.engine_finish_reason"  # stop / length / early_stop / ...
ROUND_CALLS = "agentrt.round.tool_calls"
ROUND_INVALID = "agentrt.round.invalid_calls"
TURN_ROUNDS = "agentrt.turn.rounds"
TURN_TOOL_CALLS = "agentrt.turn.tool_calls"
TURN_STOPPED_BY_TOOL = "agentrt.turn.stopped_by_tool"
TURN_ROUND_LIMIT = "agentrt.turn.stopped_by_round_limit"
TASK_ID = "agentrt.task.id"
WORKFLOW = "agentrt.task.workflow"
TOOL_ATTEMPTS = "agentrt.tool.attempts"
TOOL_AGENT = "agentrt.tool.agent"  # the agent whose turn called the tool


def model_name(engine: Any) -> str:
    """The engine's model (`Engine.model_name`), else "local"."""
    return str(engine.model_name or "local")


def request_attributes(params: Any) -> dict[str, Any]:
    """gen_ai.request.* from SamplingParams."""
    out = {REQUEST_MAX_TOKENS: params.max_tokens, REQUEST_TEMPERATURE: float(params.temperature),
           REQUEST_TOP_P: float(params.top_p)}
    if params.top_k:
        out[REQUEST_TOP_K] = params.top_k
    if params.seed is not None:
        out[REQUEST_SEED] = params.seed
    return out


def usage_attributes(usage: Any) -> dict[str, Any]:
    """One engine request's Usage -> token usage and what the engine did for it."""
    out = {INPUT_TOKENS: usage.prompt_tokens, OUTPUT_TOKENS: usage.completion_tokens,
           CACHE_READ_TOKENS: usage.cached_tokens, PREFILL_REUSED: usage.cached_tokens,
           PREFILL_COMPUTED: usage.computed_prompt_tokens, QUEUE_WAIT: usage.queue_wait_s,
           PREEMPTIONS: usage.preemptions, OVERTOOK: usage.overtook, KV_PROMOTED: usage.promoted_tokens,
           KV_PROMOTE_S: usage.promote_s}
    if usage.spec_proposed:
        out |= {SPEC_PROPOSED: usage.spec_proposed, SPEC_ACCEPTED: usage.spec_accepted,
                SPEC_ACCEPTANCE: usage.spec_accepted / usage.spec_proposed}
    return out


def summed_usage(usages: Sequence[Any]) -> dict[str, Any]:
    """A turn's token usage over its rounds."""
    return {INPUT_TOKENS: sum(u.prompt_tokens for u in usages),
            OUTPUT_TOKENS: sum(u.completion_tokens for u in usages),
            CACHE_READ_TOKENS: sum(u.cached_tokens for u in usages),
            PREFILL_COMPUTED: sum(u.computed_prompt_tokens for u in usages),
            QUEUE_WAIT: sum(u.queue_wait_s for u in usages)}


def round_attributes(end: Any) -> dict[str, Any]:
    """A finished round (RoundEnd): its usage, finish reason (as API clients name it) and calls."""
    out = {FINISH_REASONS: (end.api_finish_reason,), ROUND_CALLS: len(end.calls), ROUND_INVALID: len(end.invalid),
           ENGINE_FINISH: end.finish_reason or "none"}
    return out | (usage_attributes(end.usage) if end.usage is not None else {})


def turn_attributes(result: Any) -> dict[str, Any]:
    """A finished agent turn (TurnResult)."""
    out = {TURN_ROUNDS: result.rounds, TURN_TOOL_CALLS: len(result.tool_results),
           TURN_ROUND_LIMIT: result.stopped_by_round_limit, **summed_usage(result.usage)}
    if result.stopped_by_tool is not None:
        out[TURN_STOPPED_BY_TOOL] = result.stopped_by_tool
    return out


def tool_attributes(result: Any) -> dict[str, Any]:
    """A finished tool call (ToolResult); an error result gets error.type."""
    out = {TOOL_ATTEMPTS: result.attempts}
    if result.is_error:
        out[ERROR_TYPE] = "tool_error"
    return out


def http_attributes(outcome: tuple[int, str | None]) -> dict[str, Any]:
    """An HTTP request's (status code, route template or None); a 5xx gets error.type."""
    status, route = outcome
    out: dict[str, Any] = {HTTP_STATUS: status}
    if route:
        out[HTTP_ROUTE] = route
    if status >= 500:
        out[ERROR_TYPE] = str(status)
    return out
