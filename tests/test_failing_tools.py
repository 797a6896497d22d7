"""A tool that raises (issue 57): the identical failing call is run once per turn, the turn ends
when the model only repeats it (the error in the caller's TurnResult), a changed call still runs,
and every failure is logged with its traceback. The model's replies are scripted
(tests/test_pipelined_tools.py's ScriptedEngine: the real tokenizer, chat format and parser)."""

from __future__ import annotations

import anyio
import structlog

from agentrt import Agent, Runtime, tool
from agentrt.toolcall.formats import HERMES
from tests.test_pipelined_tools import ScriptedEngine


def _turn(replies: list[str], fn):
    engine = ScriptedEngine(replies)
    agent = Agent("a", "", [fn], engine=engine, constrained=False, parallel_tool_calls=False)

    async def main():
        async with Runtime(engine) as rt:
            ref = await rt.spawn(agent, name="a")
            return await ref.ask("go")
    with structlog.testing.capture_logs() as logs:
        result = anyio.run(main)
    return result, engine, logs


def test_an_identical_failing_call_runs_once_and_ends_the_turn():
    runs = []

    @tool
    def lookup(city: str) -> str:
        """Look a city up."""
        runs.append(city)
        raise RuntimeError("the lookup service is down")

    call = HERMES.render_calls([("lookup", {"city": "Paris"})])
    result, engine, logs = _turn([call] * 8, lookup)
    assert runs == ["Paris"]  # (eight scripted repeats: one run)
    assert result.stopped_by_repeated_failure == "lookup" and result.rounds == 2
    first, second = result.tool_results
    assert first.is_error and "the lookup service is down" in first.content and first.attempts == 1
    assert second.is_error and second.attempts == 0 and "not run again" in second.content
    assert "the lookup service is down" in second.content
    failed = [e for e in logs if e["event"] == "tool.failed"]
    assert len(failed) == 1 and failed[0]["tool"] == "lookup" and failed[0]["log_level"] == "warning"
    assert isinstance(failed[0]["exc_info"], RuntimeError)
    assert len(engine.replies) == 6  # (the turn asked the model twice, not eight times)


def test_a_changed_call_after_a_failure_still_runs():
    runs = []

    @tool
    def lookup(city: str) -> str:
        """Look a city up."""
        runs.append(city)
        if city == "Pari":
            raise ValueError("no such city")
        return "sunny"

    replies = [HERMES.render_calls([("lookup", {"city": "Pari"})]),
               HERMES.render_calls([("lookup", {"city": "Paris"})]), "It is sunny."]
    result, _, logs = _turn(replies, lookup)
    assert runs == ["Pari", "Paris"] and result.text == "It is sunny."
    assert result.stopped_by_repeated_failure is None
    assert [e["tool"] for e in logs if e["event"] == "tool.failed"] == ["lookup"]


def test_a_call_cut_short_by_max_tokens_says_to_raise_it():
    """A required call with too small a max_tokens ends inside the call: the error the model and
    the caller see names max_tokens (the real engine, on scripted replies)."""
    from agentrt import Engine, EngineConfig, SamplingParams
    from tests.scripted_model import scripted

    @tool
    def get_weather(city: str) -> dict:
        """Current weather in a city."""
        return {"city": city}

    def reply(prompt: str) -> str:
        return HERMES.render_calls([("get_weather", {"city": "Paris, the capital of France"})])

    async def main(max_tokens: int):
        async with Engine(scripted(reply), EngineConfig(kv_cache_tokens=8192)) as eng, Runtime(eng) as rt:
            ref = await rt.spawn(Agent("w", "Use the tool.", [get_weather], engine=eng, tool_choice="required",
                                       max_tool_rounds=1, settings=SamplingParams(max_tokens=max_tokens)), name="w")
            return await ref.ask("Weather in Paris?")
    cut = anyio.run(main, 8).tool_results[0]
    assert cut.is_error and "max_tokens ran out (8 tokens); raise max_tokens" in cut.content
    whole = anyio.run(main, 64).tool_results[0]
    assert not whole.is_error and whole.raw == {"city": "Paris, the capital of France"}
