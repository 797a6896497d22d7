"""The text side of an engine, built by the conversation layer: the chat format (the model's
template, its tool-call format; conversation/chat_format.py) and the grammar factory (constrained
decoding in that format; constrain/grammar.py). Each is built on first use from the engine's
tokenizer and config and kept in the engine's `shared` slot, so every conversation, agent, chat
model and server route on one engine shares one of each (compiled grammars are cached there).

An engine that is not local (integrations/ray's RemoteEngine) puts its own in `shared` when it is
made: a chat format from the replica, and grammars built on the replica."""

from __future__ import annotations

from agentrt.conversation.chat_format import ChatFormat, build_chat_format
from agentrt.errors import ConfigError

CHAT_FORMAT, GRAMMARS = "chat_format", "grammars"


def chat_format_of(engine) -> ChatFormat:
    """The engine's ChatFormat (immutable; built once)."""
    shared = engine.shared
    fmt = shared.get(CHAT_FORMAT)
    if fmt is None:
        if engine.tokenizer is None:
            raise ConfigError("chat formatting needs a tokenizer: build the engine from load_model(...)")
        fmt = shared[CHAT_FORMAT] = build_chat_format(engine.tokenizer, engine.config)
    return fmt


def grammars_of(engine):
    """The engine's grammar factory (a GrammarFactory in the chat format's tool-call format)."""
    shared = engine.shared
    factory = shared.get(GRAMMARS)
    if factory is None:
        from agentrt.constrain.grammar import GrammarFactory  # (xgrammar loads on first use)

        if engine.tokenizer is None:
            raise ConfigError("constrained decoding needs a tokenizer: build the engine from load_model(...)")
        factory = shared[GRAMMARS] = GrammarFactory(engine.tokenizer, engine.model.cfg.vocab_size,
                                                    tool_format=chat_format_of(engine).tool_format)
    return factory
