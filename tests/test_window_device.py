"""The sliding-window layers' page map (KVStore.local_of) beside a store on another device.

The tier (kv/tier.py) and branching (kv/branching.py, through kv/kv_io.py) index the map with
tensors on the store's device; a map left on the host fails there on a GPU. The `meta` device
stands in for the GPU (tests/test_device_placement.py): a store on `meta` runs the same flow,
restore, fork, export, demote to the tier and promote back, where an index on the wrong device
raises (index_copy_ checks every operand's device). On the CPU the same flow ends in a turn on
the promoted prefix, token for token with greedy generate() on the history alone.
"""

from __future__ import annotations

import pytest
import torch

from agentrt.config import EngineConfig
from agentrt.engine.core import EngineCore
from agentrt.engine.executor import ModelExecutor
from agentrt.kv.store import KVStore
from agentrt.model.generate import generate
from agentrt.model.loaders.load import load_model
from agentrt.sampling import SamplingParams
from tests.engine_util import drain, submit

pytest.importorskip("transformers")
PS = 16


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    """Qwen2 with a full-attention layer beside a sliding one (window 24), the torch reference."""
    from tests.test_sliding_window import make

    root = tmp_path_factory.mktemp("qwen2-layer1")
    make("qwen2-layer1").save_pretrained(root / "hf", safe_serialization=True)
    return load_model(str(root / "hf"), quantize="none", forward="eager").model


class StoreOn(ModelExecutor):
    """The model's executor with its KV store on `device` (the model stays where it is)."""

    def __init__(self, model, device: str):
        super().__init__(model, "eager")
        self.store_device = torch.device(device)

    def allocate(self, num_pages: int, page_size: int, num_local: int | None = None) -> KVStore:
        return KVStore.allocate(self.model.cfg, num_pages, page_size, self.model.kv_dtype,
                                device=self.store_device, num_local=num_local)


def engine(model, executor=None) -> EngineCore:
    cfg = EngineConfig(kv_cache_tokens=4096, chunk_min=16, chunk_max=16, n_batch=16, window_kv_tokens=320,
                       response_cache_size=0, debug_invariants=True, kv_tier_bytes=64 << 20)
    return EngineCore(model, cfg, executor=executor)


def tokens(seed: int, n: int) -> list[int]:
    return torch.randint(3, 320, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def snapshot(model) -> dict:
    """A session's snapshot on the CPU, past its window: its first pages' local KV released."""
    core = engine(model)
    es = core.open_session(core.pool.acquire("session", 0), tag="src")
    submit(core, tokens(50, 120), SamplingParams(max_tokens=6), session=es)
    drain(core)
    data = core.branching.export(es)
    assert bool(data["local_absent"][0]) and not bool(data["local_absent"][-1])
    return data


@pytest.mark.parametrize("device", ["meta", "cpu"])
def test_tier_and_branching_with_the_store_on_its_device(model, device):
    data = snapshot(model)
    core = engine(model, StoreOn(model, device))
    store = core.kvm.store
    assert store.device.type == device and store.local_of is not None
    assert store.local_of.device_map.device.type == device and store.local_host.device.type == "cpu"
    local = store.local_layers.index(True)
    idx = torch.arange(3, device=store.device)
    assert store.rows(local, idx).device.type == device
    es = core.branching.restore(core.pool.acquire("session", 0), data, tag="restored", cache_salt=None)
    fork = core.branching.fork(es, core.pool.acquire("session", 0), tag="fork")
    back = core.branching.export(fork)
    assert back["k"].device == store.host_device and back["k"].shape == data["k"].shape
    assert torch.equal(back["local_absent"], data["local_absent"])
    if device == "cpu":  # (the KV that came back: all of the global layers', the local ones' kept)
        kept = ~data["local_absent"]
        for i, is_local in enumerate(store.local_layers):
            for a, b in ((back["k"][i], data["k"][i]), (back["v"][i], data["v"][i])):
                assert torch.equal(a[kept], b[kept]) if is_local else torch.equal(a, b)
    for s in (es, fork):
        core.close_session(s)
    radix, demoted = core.radix, 0
    for leaf in list(radix.resident_leaves()):
        absent = [i for i, p in enumerate(leaf.pages) if not core.alloc.local.present(p)]
        radix.discard(leaf)  # (demoted: the tier copies its pages out of the store)
        assert leaf.host is not None and list(leaf.host.absent) == absent
        assert leaf.host.k.device == store.host_device
        demoted += len(leaf.host.absent)
    assert demoted > 0
    core.check_invariants()
    core.costs.s_per_token = 1.0  # (a recompute dearer than any copy: the tier's copy is taken)
    history = data["tokens"]
    start, end = core.hierarchy.promote_prefix(history, None)
    assert end > start  # (promoted: the tier copied its pages back into the store)
    core.check_invariants()
    if device == "cpu":
        prompt, sp = history + tokens(51, 7), SamplingParams(max_tokens=8)
        q = submit(core, prompt, sp)
        drain(core)
        assert q.output == generate(model, prompt, sp)
