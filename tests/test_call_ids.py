"""Tool-call ids: one rule (conversation/call_ids.py), the same ids as before it at each place."""

from __future__ import annotations

from agentrt.conversation.call_ids import CALL, call_id, call_prefix, scoped
from agentrt.conversation.messages import normalize
from agentrt.conversation.reply import call_id as reply_call_id
from agentrt.conversation.reply import call_prefix as reply_call_prefix
from agentrt.fingerprint import fnv1a


def test_every_id_is_prefix_underscore_index():
    assert call_id(CALL, 3) == "call_3"  # a bare Conversation.round's default
    assert call_id(scoped("planner"), 12) == "call_planner_12"  # an agent's
    assert call_id(scoped(4), 0) == "call_4_0"  # a message's call that came without an id
    prompt = [1, 2, 3]
    assert call_prefix(prompt) == f"call_{fnv1a(prompt) & 0xFFFFFFFFFFFF:012x}"  # the server's and ChatAgentrt's
    assert reply_call_id is call_id and reply_call_prefix is call_prefix


def test_a_message_call_without_an_id_gets_the_rules_id():
    msg = {"role": "assistant", "content": "", "tool_calls": [
        {"type": "function", "function": {"name": "f", "arguments": "{}"}},
        {"id": "mine", "type": "function", "function": {"name": "g", "arguments": "{}"}}]}
    calls = normalize(1, msg)["tool_calls"]
    assert [c["id"] for c in calls] == ["call_1_0", "mine"]
