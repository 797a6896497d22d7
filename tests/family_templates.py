"""Phi-4-mini-instruct's and Gemma 3's real chat templates (from their tokenizer_config.json; the
Gemma 3 one as Gorilla BFCL's Gemma handler quotes it) on SmolLM2's tokenizer with each family's
control tokens added, so the template's control tokens are control tokens (no model files)."""

from __future__ import annotations

import tokenizers
from tokenizers import AddedToken

from agentrt.model.tokenizer import Tokenizer
from tests.conftest import smol_tokenizer

PHI4_MINI_TEMPLATE = (
    "{% for message in messages %}{% if message['role'] == 'system' and 'tools' in message and "
    "message['tools'] is not none %}{{ '<|' + message['role'] + '|>' + message['content'] + '<|tool|>' + "
    "message['tools'] + '<|/tool|>' + '<|end|>' }}{% else %}{{ '<|' + message['role'] + '|>' + "
    "message['content'] + '<|end|>' }}{% endif %}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|assistant|>' }}{% else %}{{ eos_token }}{% endif %}"
)
PHI4_MINI_TOKENS = ("<|system|>", "<|user|>", "<|assistant|>", "<|end|>", "<|tool|>", "<|/tool|>", "<|tool_call|>",
                    "<|/tool_call|>", "<|tool_response|>")

GEMMA3_TEMPLATE = """{{ bos_token }}
{%- if messages[0]['role'] == 'system' -%}
    {%- if messages[0]['content'] is string -%}
        {%- set first_user_prefix = messages[0]['content'] + '\\n\\n' -%}
    {%- else -%}
        {%- set first_user_prefix = messages[0]['content'][0]['text'] + '\\n\\n' -%}
    {%- endif -%}
    {%- set loop_messages = messages[1:] -%}
{%- else -%}
    {%- set first_user_prefix = "" -%}
    {%- set loop_messages = messages -%}
{%- endif -%}
{%- for message in loop_messages -%}
    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}
        {{ raise_exception("Conversation roles must alternate user/assistant/user/assistant/...") }}
    {%- endif -%}
    {%- if (message['role'] == 'assistant') -%}
        {%- set role = "model" -%}
    {%- else -%}
        {%- set role = message['role'] -%}
    {%- endif -%}
    {{ '<start_of_turn>' + role + '\\n' + (first_user_prefix if loop.first else "") }}
    {%- if message['content'] is string -%}
        {{ message['content'] | trim }}
    {%- elif message['content'] is iterable -%}
        {%- for item in message['content'] -%}
            {%- if item['type'] == 'image' -%}
                {{ '<start_of_image>' }}
            {%- elif item['type'] == 'text' -%}
                {{ item['text'] | trim }}
            {%- endif -%}
        {%- endfor -%}
    {%- else -%}
        {{ raise_exception("Invalid content type") }}
    {%- endif -%}
    {{ '<end_of_turn>\\n' }}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {{'<start_of_turn>model\\n'}}
{%- endif -%}
"""
GEMMA3_TOKENS = ("<start_of_turn>", "<end_of_turn>", "<start_of_image>")


def _variant(template: str, specials: tuple[str, ...], eos: tuple[str, ...]) -> Tokenizer:
    smol = smol_tokenizer()
    backend = tokenizers.Tokenizer.from_str(smol._special.to_str())
    backend.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in specials])
    return Tokenizer(backend, bos_token_id=smol.bos_token_id, eos_token_ids=[backend.token_to_id(t) for t in eos],
                     chat_template=template)


def phi4_mini_tokenizer() -> Tokenizer:
    """eos_token `<|endoftext|>` (what the template's `{{ eos_token }}` writes), and `<|end|>`
    (generation_config's second stop token, what ends a turn)."""
    return _variant(PHI4_MINI_TEMPLATE, PHI4_MINI_TOKENS, ("<|endoftext|>", "<|end|>"))


def gemma3_tokenizer() -> Tokenizer:
    """Turns end with `<end_of_turn>` (Gemma 3's generation_config stops on it)."""
    return _variant(GEMMA3_TEMPLATE, GEMMA3_TOKENS, ("<end_of_turn>", "<|endoftext|>"))
