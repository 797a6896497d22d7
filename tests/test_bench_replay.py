"""bench/workloads/replay.py scripts and the forced decoding of bench/peers on tiny models."""

from __future__ import annotations

import anyio
import pytest

from agentrt import EngineConfig
from agentrt.conversation.chat_format import ChatFormat
from bench.peers.agentrt_peer import AgentrtSystem, ForcedTokens
from bench.peers.base import CallRecord, SerialModel, drive
from bench.workloads.bfcl import BfclEntry, BfclTurn
from bench.workloads.replay import FINAL_ANSWER, bfcl_script, check_script
from bench.workloads.synthetic_agents import SyntheticSpec, synthetic_scripts
from tests.conftest import smol_tokenizer, tiny_model_with_tokenizer

pytestmark = pytest.mark.embedded  # the embedded SmolLM2's tokenizer builds the scripts


def _fmt():
    return ChatFormat(smol_tokenizer())


def _small(agents=2, turns=3, seed=0, **kw):
    spec = SyntheticSpec(agents=agents, turns=turns, anchor_tokens=120, user_tokens=16,
                         result_tokens=(8, 16), seed=seed, **kw)
    return synthetic_scripts(_fmt(), smol_tokenizer(), spec)


def _bfcl_entry() -> BfclEntry:
    calls = [{"name": "ls", "arguments": {"a": True}}, {"name": "cd", "arguments": {"folder": "doc"}}]
    results = [{"role": "tool", "name": "ls", "content": '{"current_directory_content": ["doc"]}'},
               {"role": "tool", "name": "cd", "content": '{"current_working_directory": "doc"}'}]
    tools = [{"type": "function", "function": {"name": n, "description": "d",
                                                "parameters": {"type": "object", "properties": {}}}}
             for n in ("ls", "cd")]
    turns = [BfclTurn(user=[{"role": "user", "content": "go to doc"}], rounds=[(calls, results)]),
             BfclTurn(user=[{"role": "user", "content": "thanks"}], rounds=[])]
    return BfclEntry("multi_turn_base_0", "multi_turn_base", "You call functions.", tools, turns)


def test_synthetic_scripts_are_prefix_consistent_and_seeded():
    scripts = _small(agents=3, turns=4)
    tok = smol_tokenizer()
    for s in scripts:
        check_script(s, 8192)
        assert [c.turn for c in s] == list(range(4))
        assert all(c.output[-1] in tok.eos_token_ids for c in s)
        assert "<tool_call>" in tok.decode(s[0].output) and "<tool_call>" not in tok.decode(s[-1].output)
    assert scripts[0][0].prompt[:50] == scripts[1][0].prompt[:50]  # shared system prompt
    assert _small(agents=3, turns=4) == scripts
    distinct = _small(agents=2, turns=2, shared_system=False)
    assert distinct[0][0].prompt[:60] != distinct[1][0].prompt[:60]


def test_bfcl_script_rounds_and_final_answer():
    calls = bfcl_script(_fmt(), 0, _bfcl_entry(), tool_latency_s=0.1)
    check_script(calls)
    tok = smol_tokenizer()
    texts = [tok.decode(c.output) for c in calls]
    assert len(calls) == 3  # turn 1: the round's calls, then "Done."; turn 2: "Done."
    assert texts[0].count("<tool_call>") == 2 and FINAL_ANSWER in texts[1] and FINAL_ANSWER in texts[2]
    assert [c.tool_latency_s for c in calls] == [0.0, 0.1, 0.0]
    assert "current_working_directory" in tok.decode(calls[1].prompt[len(calls[0].prompt):])


def test_forced_tokens_protocol():
    import torch

    f = ForcedTokens([3, 1, 2])
    assert int(f.mask_logits(torch.zeros(5)).argmax()) == 3
    assert f.accepts_prefix([9, 9, 9, 9]) == 3
    for t in (3, 1):
        f.advance(t)
    assert not f.is_terminated() and f.accepts_prefix([2, 5]) == 1
    f.advance(2)
    assert f.is_terminated()


@pytest.mark.parametrize("spec", [True, False])
@pytest.mark.parametrize("system", ["full", "stateless", "prefix_lru"])
def test_agentrt_decodes_exactly_the_script(system, spec):
    lm = tiny_model_with_tokenizer()
    cfg = EngineConfig(kv_cache_tokens=8192, response_cache_size=0, enable_speculation=spec)
    sysm = getattr(AgentrtSystem, system)(lm, cfg)
    scripts = _small(agents=2, turns=3)
    res = anyio.run(sysm.run, scripts, "interleaved")
    assert len(res.records) == 6 and all(r.exact for r in res.records)
    assert res.extra["prompt_submitted"] == sum(len(c.prompt) for s in scripts for c in s)
    if system == "full":
        assert res.extra["prompt_computed"] < res.extra["prompt_submitted"] / 2
    if system == "stateless":
        assert res.extra["prompt_computed"] == res.extra["prompt_submitted"]


def test_transformers_peer_forces_the_script():
    from bench.peers.hf_peer import TransformersSystem
    from tests.conftest import make_hf_model

    hf = make_hf_model("llama", seed=3, vocab_size=49152, hidden_size=48, intermediate_size=96,
                       num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                       max_position_embeddings=8192)
    res = anyio.run(TransformersSystem(hf).run, _small(agents=2, turns=2), "concurrent")
    assert len(res.records) == 4 and all(r.exact for r in res.records)
    assert all(r.computed_prompt_tokens == r.prompt_tokens for r in res.records)


def test_drive_interleaved_order_and_serial_fifo():
    scripts = _small(agents=3, turns=2)
    order = []

    def fn(c, t_submit):
        order.append((c.turn, c.agent))
        return CallRecord(c.agent, c.turn, 0.0, 0.0, len(c.prompt), 0, len(c.output), True)

    records, wall = anyio.run(drive, scripts, "interleaved", SerialModel(fn))
    assert order == [(0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (1, 2)] and wall >= 0
    records, _ = anyio.run(drive, scripts, "concurrent", SerialModel(fn))
    assert len(records) == 6


class _Bar:
    def update(self, n):
        pass

    def set_postfix_str(self, s):
        pass


def test_driver_case_tables_plots_and_headline(tmp_path, capsys):
    from bench.agents_report import plot, print_case
    from bench.bench_agents import headline, run_case
    from bench.cases.agents_cases import Case, SystemFactory

    lm = tiny_model_with_tokenizer()
    factory = SystemFactory(lm, EngineConfig(response_cache_size=0))
    case = Case("agents8_small_pool", "tiny", ("agentrt", "agentrt_prefix_lru", "transformers"),
                "interleaved", lambda rep: _small(agents=3, turns=2, seed=rep), 0.6)
    out = run_case(case, factory, ["agentrt", "agentrt_prefix_lru", "transformers"], 2, _Bar())
    assert out["systems"]["agentrt"]["exact"] and out["systems"]["agentrt_prefix_lru"]["exact"]
    assert out["systems"]["transformers"]["status"] == "not run"  # "tiny-random" is no GGUF file
    r = out["ratios"]["agentrt_prefix_lru"]["per_turn_speedup"]
    assert len(r["per_rep"]) == 2 and r["median"] > 0
    keys, reasons = headline({"agents8_small_pool": out})
    assert keys["per_turn_speedup_8agents_vs_prefix_lru"] == r["median"]
    bfcl = "e2e_speedup_bfcl_vs_llamacpp_per_agent"
    assert keys[bfcl] is None and "bfcl" in reasons[bfcl]
    print_case("agents8_small_pool", out)
    assert "agentrt_prefix_lru" in capsys.readouterr().out
    assert [p.name for p in plot({"agents8_small_pool": out}, tmp_path)] == ["agents_turns.png", "agents_e2e.png"]


def test_llamacpp_peer_reuses_each_agents_prefix():
    pytest.importorskip("llama_cpp")
    from agentrt.model.loaders.files import resolve_source
    from bench.peers.llamacpp_peer import LlamaCppSystem
    from bench.workloads.replay import ModelCall

    def script(agent, base):
        p1 = list(range(base, base + 24))
        p2 = p1 + [7, 8, 9, 2] + list(range(base + 100, base + 110))
        return [ModelCall(agent, 0, p1, [7, 8, 9, 2], 0.0), ModelCall(agent, 1, p2, [5, 2], 0.0)]

    scripts = [script(0, 1000), script(1, 3000)]
    for make, second_turn_computed in ((LlamaCppSystem.per_agent_system, 11), (LlamaCppSystem.shared, 38)):
        system = make(str(resolve_source("smollm2-135m")), 1)
        try:
            res = anyio.run(system.run, scripts, "interleaved")
        finally:
            system.close()
        assert all(r.exact for r in res.records)
        by_turn = {(r.agent, r.turn): r.computed_prompt_tokens for r in res.records}
        assert by_turn[(0, 0)] == 24 and by_turn[(1, 1)] == second_turn_computed
