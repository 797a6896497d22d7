"""An agent on a tiny random model in each tool-call format (hermes fallback, Qwen2.5, Llama 3.1
style, Mistral style, Phi-4-mini, Gemma 3): the grammar makes the model write the call in its family's format, the
parser reads it, the tool runs, and the next round's prompt is the template's rendering of the
conversation (decoded token for token). The Llama 3 and Mistral templates are small ones written
for this test in those families' style (headers, "parameters", [TOOL_CALLS] as a control token);
the Qwen2.5, Phi-4-mini and Gemma 3 ones are the real templates (tests/fixtures,
tests/family_templates.py)."""

from __future__ import annotations

import functools
import json
from typing import Literal

import anyio
import pytest
import tokenizers
from tokenizers import AddedToken

from agentrt import Agent, Engine, EngineConfig, Runtime, tool
from agentrt.conversation.conversation import Conversation
from agentrt.conversation.engine_text import chat_format_of, grammars_of
from agentrt.model.decoder import DecoderModel
from agentrt.model.loaders.load import LoadedModel
from agentrt.model.tokenizer import Tokenizer
from agentrt.runtime.turn_events import RoundStarted, TurnResult
from agentrt.sampling import SamplingParams
from tests.conftest import config_of, make_hf_model, smol_tokenizer
from tests.engine_util import assert_quiescent
from tests.family_templates import gemma3_tokenizer, phi4_mini_tokenizer
from tests.qwen_fixture import qwen_tokenizer

LLAMA3_STYLE = (
    "{{ bos_token }}{% for m in messages %}"
    "{% if m.role == 'system' %}<|im_start|>system\n{% if tools %}Environment: ipython\n"
    "Call a function by answering with {\"name\": function name, \"parameters\": arguments}.\n"
    "{% for t in tools %}{{ t | tojson }}\n{% endfor %}{% endif %}{{ m.content }}<|im_end|>"
    "{% elif m.role == 'tool' %}<|im_start|>ipython\n{{ m.content }}<|im_end|>"
    "{% elif m.tool_calls %}<|im_start|>assistant\n{% for c in m.tool_calls %}"
    "{\"name\": \"{{ c.function.name }}\", \"parameters\": {{ c.function.arguments | tojson }}}"
    "{% endfor %}<|im_end|>"
    "{% else %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
MISTRAL_STYLE = (  # tools go before the LAST user message: a later user turn re-renders the past
    "{% set ns = namespace(last=-1) %}{% for m in messages %}{% if m.role == 'user' %}"
    "{% set ns.last = loop.index0 %}{% endif %}{% endfor %}"
    "{{ bos_token }}{% for m in messages %}"
    "{% if m.role == 'user' %}{% if tools and loop.index0 == ns.last %}[AVAILABLE_TOOLS]{{ tools | tojson }}[/AVAILABLE_TOOLS]"
    "{% endif %}[INST]{{ m.content }}[/INST]"
    "{% elif m.role == 'system' %}[SYS]{{ m.content }}[/SYS]"
    "{% elif m.role == 'tool' %}[TOOL_RESULTS]{{ m.content }}[/TOOL_RESULTS]"
    "{% elif m.tool_calls %}[TOOL_CALLS][{% for c in m.tool_calls %}"
    "{\"name\": \"{{ c.function.name }}\", \"arguments\": {{ c.function.arguments | tojson }}}"
    "{% if not loop.last %}, {% endif %}{% endfor %}]<|im_end|>"
    "{% else %}{{ m.content }}<|im_end|>{% endif %}{% endfor %}"
)


@tool
def get_weather(city: Literal["Paris", "Rome"]) -> str:
    """Current weather.

    Args:
        city: the city
    """
    return f"{city}: sunny, 21 C"


def _smol_variant(template: str | None, extra_special: tuple[str, ...] = ()) -> Tokenizer:
    smol = smol_tokenizer()
    backend = tokenizers.Tokenizer.from_str(smol._special.to_str())
    backend.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in extra_special])
    return Tokenizer(backend, bos_token_id=smol.bos_token_id, eos_token_ids=smol.eos_token_ids,
                     pad_token_id=smol.pad_token_id, chat_template=template or smol.chat_template)


@functools.lru_cache(maxsize=6)
def _model(name: str, tmp: str) -> LoadedModel:
    from pathlib import Path

    if name == "qwen":
        tok, arch = qwen_tokenizer(Path(tmp)), "qwen2"
    else:
        tok = {"hermes": lambda: _smol_variant(None), "llama3": lambda: _smol_variant(LLAMA3_STYLE),
               "mistral": lambda: _smol_variant(MISTRAL_STYLE, ("[TOOL_CALLS]",)),
               "phi4": phi4_mini_tokenizer, "gemma": gemma3_tokenizer}[name]()
        arch = "llama"
    hf = make_hf_model(arch, seed=5, vocab_size=tok.vocab_size + 8, hidden_size=48, intermediate_size=96,
                       num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                       max_position_embeddings=4096)
    m = DecoderModel(config_of(hf))
    m.load_hf_weights(hf.state_dict())
    return LoadedModel(m.eval(), tok, m.cfg, f"tiny-{name}")


@pytest.mark.parametrize("name", ["hermes", "qwen", "llama3", "mistral", "phi4", "gemma"])
def test_agent_calls_a_tool_in_the_family_format(name, tmp_path_factory):
    lm = _model(name, str(tmp_path_factory.getbasetemp() / "qwen"))
    prompts = {}

    async def main():
        async with Engine(lm, EngineConfig(kv_cache_tokens=4096, response_cache_size=0, debug_invariants=True)) as eng:
            assert chat_format_of(eng).tool_format.name == name
            agent = Agent("a", "Use the tool.", [get_weather], tool_choice="get_weather", max_tool_rounds=1,
                          settings=SamplingParams(max_tokens=48))
            async with Runtime(eng) as rt:
                ref = await rt.spawn(agent, name="a")
                for n, question in enumerate(["Weather in Paris?", "And in Rome?"]):
                    async for ev in ref.ask_stream(question):
                        if isinstance(ev, RoundStarted):
                            prompts[n, ev.round] = (list(agent.tokens), [dict(m) for m in agent.messages],
                                                    dict(agent.conversation.ends))
                        elif isinstance(ev, TurnResult) and n == 0:
                            result = ev
            assert_quiescent(eng.core)
            return chat_format_of(eng), agent, result

    chat, agent, result = anyio.run(main)
    [res] = result.tool_results
    assert res.name == "get_weather" and not res.is_error and res.content.endswith("sunny, 21 C")
    call = result.messages[0]["tool_calls"][0]["function"]
    assert call["name"] == "get_weather" and '"city"' in call["arguments"]
    tools = [get_weather.openai_schema()]
    tokens, messages, _ = prompts[0, 1]  # after the tool result: all of it is the template's rendering
    assert chat.tokenizer.decode(tokens) == chat.render(messages, tools)
    assert chat.tool_format.render_calls([(call["name"], json.loads(call["arguments"]))]) in chat.render(messages, tools)
    # the next turn (Mistral-style moves the tools): what follows the model's last reply (kept as the
    # ids it generated, not its cleaned text) is the template's rendering
    tokens, messages, ends = prompts[1, 0]
    k = max(i for i, m in enumerate(messages) if m["role"] == "assistant") + 1
    if k in ends:
        whole, head = chat.render(messages, tools), chat.render(messages[:k], tools, add_generation_prompt=False)
        assert whole.startswith(head) and chat.tokenizer.decode(tokens[ends[k]:]) == whole[len(head):]
    else:  # the template re-rendered the past: re-encoded from an earlier boundary
        assert name == "mistral" and chat.tokenizer.decode(tokens) == chat.render(messages, tools)
    assert prompts[0, 1][1][-1]["role"] == "tool" and prompts[0, 1][1][-2]["tool_calls"]
    assert (name == "mistral") == (k not in ends)


def test_round_after_merged_tool_results_reuses_the_kv(tmp_path_factory):
    """Qwen2.5 merges consecutive tool results: appending them one at a time re-encodes only the
    merged turn, and the engine prefills only from the last boundary that still holds."""
    lm = _model("qwen", str(tmp_path_factory.getbasetemp() / "qwen"))
    def call(i, c):
        return {"id": f"c{i}", "type": "function", "function": {"name": "get_weather", "arguments": {"city": c}}}

    async def main():
        async with Engine(lm, EngineConfig(kv_cache_tokens=4096, response_cache_size=0, debug_invariants=True)) as eng:
            session = await eng.open_session()
            conv = Conversation(eng, tools=[get_weather.openai_schema()], session=session)
            conv.append([{"role": "user", "content": "Paris and Rome?"}])
            params = SamplingParams(max_tokens=4)
            [end] = [ev async for ev in conv.round(params, tool_choice="none") if hasattr(ev, "message")]
            conv.messages[-1] = {"role": "assistant", "content": None,
                                 "tool_calls": [call(1, "Paris"), call(2, "Rome")]}  # as if it had called
            conv.append([{"role": "tool", "tool_call_id": "c1", "content": "sunny"}])
            held = conv.ends[2]
            conv.append([{"role": "tool", "tool_call_id": "c2", "content": "rain"}])
            [end] = [ev async for ev in conv.round(params, tool_choice="none") if hasattr(ev, "message")]
            await session.close()
            assert_quiescent(eng.core)
            return end, held

    end, held = anyio.run(main)
    # the history up to the assistant turn was not recomputed (less what the KV never held: the
    # last sampled token and the template's end-of-turn ids after it)
    turn_end = len(lm.tokenizer.encode("<|im_end|>\n", special=True))
    assert end.usage.cached_tokens == held - turn_end - 1
    assert end.usage.computed_prompt_tokens == end.usage.prompt_tokens - end.usage.cached_tokens


def test_the_format_can_be_chosen_in_the_config():
    import pytest as _pytest

    from agentrt.errors import ConfigError

    lm = _model("hermes", "")
    eng = Engine(lm, EngineConfig(tool_format="mistral", bare_tool_calls=True))
    fmt = chat_format_of(eng).tool_format
    assert fmt.name == "mistral" and fmt.bare and grammars_of(eng).tool_format == fmt
    assert chat_format_of(Engine(lm, EngineConfig(bare_tool_calls=False))).tool_format.bare is False
    with _pytest.raises(ConfigError, match="tool_format"):
        EngineConfig(tool_format="chatml")
