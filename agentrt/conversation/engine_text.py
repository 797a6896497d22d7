"""The text side of an engine, built by the conversation layer: the chat format (the model's
template, its tool-call format; conversation/chat_format.py) and the grammar factory (constrained
decoding in that format; constrain/grammar.py). Each is built on first use from the engine's
tokenizer and config and kept in the engine's `shared` slots (engine/shared.py), so every
conversation, agent, chat model and server route on one engine shares one of each (compiled
grammars are cached there).

An engine that is not local (integrations/ray's RemoteEngine) puts its own in `shared` when it is
made: a chat format from the replica, and grammars built on the replica."""

from __future__ import annotations

from agentrt.conversation.chat_format import ChatFormat, build_chat_format
from agentrt.errors import ConfigError


def chat_format_of(engine) -> ChatFormat:
    """The engine's ChatFormat (immutable; built once)."""
    shared = engine.shared
    if shared.chat_format is None:
        if engine.tokenizer is None:
            raise ConfigError("chat formatting needs a tokenizer: build the engine from load_model(...)")
        shared.chat_format = build_chat_format(engine.tokenizer, engine.config)
    return shared.chat_format


def grammars_of(engine):
    """The engine's grammar factory (a GrammarFactory in the chat format's tool-call format)."""
    shared = engine.shared
    if shared.grammars is None:
        from agentrt.constrain.grammar import GrammarFactory  # (xgrammar loads on first use)

        if engine.tokenizer is None:
            raise ConfigError("constrained decoding needs a tokenizer: build the engine from load_model(...)")
        shared.grammars = GrammarFactory(engine.tokenizer, engine.model.cfg.vocab_size,
                                         tool_format=chat_format_of(engine).tool_format)
    return shared.grammars
