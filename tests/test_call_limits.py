"""CallLimits / RepeatGuard on hand-made parser event sequences (the embedded-model behaviour is in
tests/integrations/test_langchain_standard_api.py::test_repeated_calls_end_the_reply)."""

from __future__ import annotations

import pytest

from agentrt import CallLimits
from agentrt.conversation.repeats import RepeatGuard
from agentrt.errors import ConfigError
from agentrt.toolcall import ArgumentsDelta, CallComplete, CallInvalid, CallStarted, InvalidKind, TextDelta


def call(index, name, pieces, args):
    return [CallStarted(index, name), *(ArgumentsDelta(index, p) for p in pieces),
            CallComplete(index, name, args, "")]


def run(guard, events):
    return [out for ev in events for out in guard.push(ev)]


def test_a_first_call_streams_untouched():
    g = RepeatGuard()
    events = [TextDelta("ok"), *call(0, "f", ['{"a": ', "1}"], {"a": 1})]
    assert run(g, events) == events and not g.repeat


def test_an_exact_repeat_is_never_seen_and_sets_repeat():
    g = RepeatGuard()
    first = call(0, "f", ['{"a": ', "1}"], {"a": 1})
    assert run(g, first) == first
    assert run(g, call(1, "f", ['{"a": ', "1}"], {"a": 1})) == [] and g.repeat
    assert run(g, [TextDelta("\n"), *call(2, "g", ["{}"], {})]) == []  # the round ended at the repeat


def test_a_call_of_the_same_tool_that_diverges_is_released_at_the_divergence():
    g = RepeatGuard()
    run(g, call(0, "f", ['{"a": ', "1}"], {"a": 1}))
    assert g.push(CallStarted(1, "f")) == []
    assert g.push(ArgumentsDelta(1, '{"a": ')) == []  # still a prefix of call 0's arguments
    assert g.push(ArgumentsDelta(1, "2")) == [CallStarted(1, "f"), ArgumentsDelta(1, '{"a": '),
                                              ArgumentsDelta(1, "2")]
    assert g.push(ArgumentsDelta(1, "}")) == [ArgumentsDelta(1, "}")]
    assert g.push(CallComplete(1, "f", {"a": 2}, "")) == [CallComplete(1, "f", {"a": 2}, "")]
    assert not g.repeat


def test_other_tools_and_invalid_calls_pass():
    g = RepeatGuard()
    run(g, call(0, "f", ["{}"], {}))
    other = call(1, "g", ["{}"], {})
    assert run(g, other) == other
    held = [CallStarted(2, "f"), ArgumentsDelta(2, "{")]
    assert run(g, held) == []  # may still repeat call 0
    bad = CallInvalid(2, "malformed", "{x", "f", InvalidKind.MALFORMED_JSON)
    assert g.push(bad) == [*held, bad] and not g.repeat  # a rejected call is reported, with its start


def test_disabled_guard_passes_everything():
    g = RepeatGuard(enabled=False)
    events = call(0, "f", ["{}"], {}) + call(1, "f", ["{}"], {})
    assert run(g, events) == events and not g.repeat


@pytest.mark.parametrize("bad", [{"max_calls": 0}, {"max_calls": 1.5}, {"max_calls": True}, {"stop_on_repeat": 1}])
def test_limits_are_checked(bad):
    with pytest.raises(ConfigError):
        CallLimits(**bad)


def test_max_calls_ends_the_round_at_the_last_allowed_call():
    """CallLimits.max_calls is the round's cap; the round's parser enforces it: the reply ends with
    the last allowed call (its tag closed) and the request is stopped there."""
    import anyio

    from agentrt import Conversation, SamplingParams
    from agentrt.toolcall.formats import HERMES
    from tests.test_pipelined_tools import ScriptedEngine

    schema = {"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"k": {"type": "integer"}}, "required": ["k"]}}}
    engine = ScriptedEngine([HERMES.render_calls([("f", {"k": i}) for i in range(4)])])
    conv = Conversation(engine, tools=[schema])
    conv.append([{"role": "user", "content": "go"}])

    async def main():
        rounds = conv.round(SamplingParams(max_tokens=400), constrained=False, limits=CallLimits(max_calls=2))
        return [ev async for ev in rounds][-1]

    end = anyio.run(main)
    assert [c.arguments for c in end.calls] == [{"k": 0}, {"k": 1}] and end.stopped and engine.stopped
    assert engine.tokenizer.decode(end.generated).endswith('{"k": 1}}')
    assert [c["function"]["arguments"] for c in conv.messages[-1]["tool_calls"]] == ['{"k": 0}', '{"k": 1}']
