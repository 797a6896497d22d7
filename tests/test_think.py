"""Reasoning blocks are split from the answer for every split of the stream."""

from __future__ import annotations

import pytest

from agentrt.toolcall import CallComplete, ToolCallParser
from agentrt.toolcall.formats import QWEN
from agentrt.toolcall.think import ThinkSplitter

CALL = QWEN.render_calls([("get_weather", {"city": "Paris"})])
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]


def split(text: str, cuts: tuple[int, ...]) -> tuple[str, str]:
    s = ThinkSplitter()
    bounds = [0, *cuts, len(text)]
    parts = [p for a, b in zip(bounds, bounds[1:]) for p in s.feed(text[a:b])] + s.close()
    return ("".join(t for k, t in parts if k == "reasoning"), "".join(t for k, t in parts if k == "answer"))


@pytest.mark.parametrize("text,reasoning,answer", [
    ("<think>\nThe user wants weather.\n</think>\n\n" + CALL, "\nThe user wants weather.\n", CALL),
    ("\n<think>a < b </thin k</think>Hi", "a < b </thin k", "Hi"),
    ("No thinking <think>here</think>", "", "No thinking <think>here</think>"),
    ("<thin", "", "<thin"),
    ("<think>unfinished", "unfinished", ""),
    ("", "", ""),
])
def test_every_split(text, reasoning, answer):
    for i in range(len(text) + 1):
        for j in range(i, len(text) + 1):
            assert split(text, (i, j)) == (reasoning, answer), (i, j)


def test_calls_after_thinking_are_parsed():
    _, answer = split("<think>call it</think>\n" + CALL, ())
    events = ToolCallParser(TOOLS, **QWEN.parser_options()).feed(answer)
    assert [e.name for e in events if isinstance(e, CallComplete)] == ["get_weather"]
