"""Tool-call ids, one rule for every place that names a call: `<prefix>_<index>` (`call_id`),
the prefix `call` or `call_<scope>` (`scoped`). Who uses which scope:

- a bare `Conversation.round`: `call_<index>` (the parser's index in the round);
- an agent: `call_<agent>_<n>`, n counted over the agent's turns (runtime/agent.py);
- the server and ChatAgentrt: `call_<12 hex digits>_<index>` from the round's prompt (`call_prefix`);
- a message's tool call that came without an id: `call_<message>_<n>` (messages.py).
"""

from __future__ import annotations

from agentrt.fingerprint import fnv1a

CALL = "call"  # the prefix of every tool-call id agentrt makes


def scoped(scope: object) -> str:
    """The prefix of the calls of `scope` (an agent's name, a hash, a message index)."""
    return f"{CALL}_{scope}"


def call_id(prefix: str, index: int) -> str:
    """The id of call number `index` under `prefix`."""
    return f"{prefix}_{index}"


def call_prefix(prompt: list[int]) -> str:
    """`call_<12 hex digits>` from the FNV-1a hash of the round's prompt: derived from the prompt,
    so the streamed and the non-streamed request of one prompt name their calls alike."""
    return scoped(f"{fnv1a(prompt) & 0xFFFFFFFFFFFF:012x}")
