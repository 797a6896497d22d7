"""`agentrt serve --replicas N` (ServerConfig(replicas=2)) on a local Ray cluster started here,
2 replicas of a tiny random model on the batch-invariant default path.

Oracle: the same conversations on a one-engine server, token for token. Checked: a conversation
(`prompt_cache_key`, a Responses chain) stays on one replica and reuses its KV; new keys spread
over the replicas; when a conversation's replica dies, its next request is answered by a live one
from the history it resends, with the one-engine server's tokens.
"""

from __future__ import annotations

import httpx
import openai
import pytest

ray = pytest.importorskip("ray")

from agentrt import EngineConfig  # noqa: E402
from agentrt.integrations.ray import ModelSpec  # noqa: E402
from agentrt.server import ServerConfig, ServerThread  # noqa: E402
from tests.conftest import tiny_native_with_tokenizer  # noqa: E402

pytestmark = [pytest.mark.slow]

CONFIG = EngineConfig(kv_cache_tokens=4096, response_cache_size=0)
QUESTIONS = ["Hello there, who are you?", "What do you like?", "Tell me more."]


def _conversations(url: str, keys: list[str], turns: int) -> dict[str, list]:
    """Each key's conversation, turn by turn: (reply token ids, cached tokens)."""
    client = openai.OpenAI(base_url=url, api_key="none-0000", max_retries=0)
    out: dict[str, list] = {k: [] for k in keys}
    history: dict[str, list] = {k: [] for k in keys}
    for t in range(turns):
        for k in keys:
            history[k].append({"role": "user", "content": QUESTIONS[t % len(QUESTIONS)]})
            r = client.chat.completions.create(model="m", messages=history[k], max_tokens=8, temperature=0,
                                               extra_body={"prompt_cache_key": k, "return_token_ids": True})
            history[k].append({"role": "assistant", "content": r.choices[0].message.content})
            out[k].append((r.choices[0].token_ids, r.usage.prompt_tokens_details.cached_tokens))
    return out


@pytest.fixture(scope="module")
def oracle():
    with ServerThread(tiny_native_with_tokenizer(), ServerConfig(port=0, model_name="m"), CONFIG) as s:
        return _conversations(s.url, ["a", "b", "c"], 3)


def test_conversations_stay_on_their_replica_and_survive_its_death(local_ray, oracle):
    spec = ModelSpec(factory=tiny_native_with_tokenizer)
    with ServerThread(spec, ServerConfig(port=0, replicas=2, model_name="m"), CONFIG, start_timeout=300) as s:
        backends = s.state.backends
        got = _conversations(s.url, ["a", "b", "c"], 2)
        homes = {k: backends.home[f"anon:{k}"] for k in "abc"}
        assert sorted(set(homes.values())) == [0, 1]  # new keys spread over the replicas
        for k in "abc":
            assert [ids for ids, _ in got[k]] == [ids for ids, _ in oracle[k][:2]]
            assert got[k][1][1] > 0  # the second turn reused the session's KV on its replica
        assert httpx.get(f"{s.base_url}/health").status_code == 200

        dead = homes["a"]
        ray.kill(backends.engines[dead].handle, no_restart=True)
        client = openai.OpenAI(base_url=s.url, api_key="none-0000", max_retries=0)
        history = []
        for t in range(3):  # conversation a's three turns again, resent whole: the third is new
            history.append({"role": "user", "content": QUESTIONS[t]})
            r = client.chat.completions.create(model="m", messages=history, max_tokens=8, temperature=0,
                                               extra_body={"prompt_cache_key": "a", "return_token_ids": True})
            history.append({"role": "assistant", "content": r.choices[0].message.content})
        assert r.choices[0].token_ids == oracle["a"][2][0]  # answered from the history, on a live replica
        assert backends.home["anon:a"] != dead and backends.live() == [1 - dead]
        chain = client.responses.create(model="m", input="Hello there, who are you?", max_output_tokens=8,
                                        temperature=0)
        follow = client.responses.create(model="m", input="What do you like?", previous_response_id=chain.id,
                                         max_output_tokens=8, temperature=0)
        assert follow.usage.input_tokens_details.cached_tokens > 0  # the chain's session, on its replica


def test_adapters_are_served_by_every_replica(local_ray, tmp_path):
    """`agentrt serve --replicas 2 --adapter a=PATH`: every replica loads it; requests naming it
    answer as a one-engine server does, whichever replica their key lands on."""
    pytest.importorskip("peft")
    from tests.conftest import make_hf_model
    from tests.test_adapters import make_adapter
    from tests.test_adapters_api import SHAPE

    make_adapter(make_hf_model("llama", seed=5, **SHAPE), tmp_path / "a", seed=90)
    config = dict(port=0, model_name="m", adapters=(("a", str(tmp_path / "a")),))

    def answers(url: str) -> dict:
        client = openai.OpenAI(base_url=url, api_key="none-0000", max_retries=0)
        assert [m.id for m in client.models.list().data] == ["m", "a"]
        return {(model, k): client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": QUESTIONS[0]}], max_tokens=8, temperature=0,
            extra_body={"prompt_cache_key": k, "return_token_ids": True}).choices[0].token_ids
            for model in ("a", "m") for k in ("x", "y", "z")}

    with ServerThread(tiny_native_with_tokenizer(), ServerConfig(**config), CONFIG) as one:
        want = answers(one.url)
    spec = ModelSpec(factory=tiny_native_with_tokenizer)
    with ServerThread(spec, ServerConfig(**config, replicas=2), CONFIG, start_timeout=300) as s:
        got = answers(s.url)
        assert sorted(set(s.state.backends.home.values())) == [0, 1]  # (both replicas answered)
    assert got == want and want[("a", "x")] != want[("m", "x")]
