"""The engine's state changes as structlog events (engine/event_log.py), captured with
structlog.testing.capture_logs: admissions, evictions (with the sessions cut), promotions, preemptions and
failures, each bound to its request / agent / session / task ids; nothing made (and no snapshot
taken) while the `agentrt.events` logger is below DEBUG, except failures at WARNING."""

from __future__ import annotations

import logging
import random
from contextlib import contextmanager

from structlog.testing import capture_logs

from agentrt.config import EngineConfig
from agentrt.engine.core import EngineCore
from agentrt.records.constraint import LogitsConstraint
from agentrt.sampling import SamplingParams
from tests.conftest import tiny_model
from tests.engine_util import drain, submit

V = 301
IDS = {"request", "agent", "session", "task"}


@contextmanager
def events_at(level: int):
    std = logging.getLogger("agentrt.events")
    old = std.level
    std.setLevel(level)
    try:
        with capture_logs() as logs:
            yield logs
    finally:
        std.setLevel(old)


def _agents_under_pressure(core: EngineCore, n_agents: int = 4, n_turns: int = 4) -> None:
    """Interleaved agent sessions on a pool too small for all of them: idle sessions are cut back."""
    rng = random.Random(5)
    system = [rng.randrange(V) for _ in range(40)]
    hist = {a: list(system) for a in range(n_agents)}
    sessions = {a: core.open_session(core.pool.acquire("session", 0), tag=f"agent{a}") for a in range(n_agents)}
    for t in range(n_turns):
        for a in range(n_agents):
            hist[a] += [rng.randrange(V) for _ in range(60)]
            r = submit(core, hist[a], SamplingParams(max_tokens=8), session=sessions[a], task=f"task{a}-{t}")
            drain(core)
            hist[a] += r.output


def test_admission_and_eviction_events_name_their_ids():
    core = EngineCore(tiny_model("llama"), EngineConfig(kv_cache_tokens=640, page_size=16))
    with events_at(logging.DEBUG) as logs:
        _agents_under_pressure(core)
    admitted = [e for e in logs if e["event"] == "request.admitted"]
    assert len(admitted) == 16
    assert all(IDS <= e.keys() and e["log_level"] == "debug" for e in admitted)
    assert {e["agent"] for e in admitted} == {f"agent{a}" for a in range(4)}
    assert all(e["task"].startswith(e["agent"].replace("agent", "task")) for e in admitted)
    assert any(e["cached_tokens"] > 0 for e in admitted)  # later turns reuse their session's KV
    evicted = [e for e in logs if e["event"] == "kv.evicted"]
    assert evicted and core.stats().evicted_pages == sum(e["pages"] for e in evicted)
    cut = [s for e in evicted for s in e["sessions"]]
    assert cut and all(s["pages_after"] < s["pages_before"] and s["agent"].startswith("agent") for s in cut)


def test_preemption_is_an_event():
    """Running decodes that find no page left preempt the youngest running request in planning
    (the pool's free pages are taken from under them here, then given back)."""
    core = EngineCore(tiny_model("llama"), EngineConfig(kv_cache_tokens=1024, page_size=16, enable_radix_cache=False))
    rng = random.Random(1)
    with events_at(logging.DEBUG) as logs:
        reqs = [submit(core, [rng.randrange(V) for _ in range(40)], SamplingParams(max_tokens=60, ignore_eos=True),
                       task=f"t{i}") for i in range(4)]
        while len(core.running) < 4 or any(r.in_prefill for r in core.running):
            core.step()
        taken = core.alloc.alloc(core.alloc.num_free)  # (an outside holder of every free page)
        for _ in range(20):
            core.step()
        core.alloc.decref(taken)
        drain(core)
    assert all(r.finish_reason == "length" for r in reqs)
    preempted = [e for e in logs if e["event"] == "request.preempted"]
    assert core.stats().preemptions > 0 and len(preempted) == core.stats().preemptions
    assert all(IDS <= e.keys() and e["preemptions"] >= 1 for e in preempted)
    assert {e["request"] for e in preempted} <= {r.rid for r in reqs}
    assert {e["task"] for e in preempted} <= {f"t{i}" for i in range(4)}
    readmitted = [e for e in logs if e["event"] == "request.admitted" and e["readmission"]]
    assert readmitted  # a preempted request is admitted again, and says so


class _Broken(LogitsConstraint):
    def mask_logits(self, logits):
        raise RuntimeError("grammar bug")

    def advance(self, token):
        pass

    def is_terminated(self):
        return False


def test_a_failure_is_a_warning_event_even_at_the_default_level():
    core = EngineCore(tiny_model("llama"), EngineConfig(kv_cache_tokens=1024))
    with events_at(logging.NOTSET) as logs:  # (the root logger's WARNING decides)
        r = submit(core, [1, 2, 3], SamplingParams(max_tokens=4), constraint=_Broken(), task="t")
        ok = submit(core, [4, 5, 6], SamplingParams(max_tokens=4))
        drain(core)
    assert r.finish_reason == "error" and ok.finish_reason == "length"
    assert [e["event"] for e in logs] == ["request.failed"]
    (e,) = logs
    assert e["log_level"] == "warning" and e["request"] == r.rid and e["task"] == "t" and "grammar bug" in e["error"]


def test_nothing_is_made_while_off():
    core = EngineCore(tiny_model("llama"), EngineConfig(kv_cache_tokens=640, page_size=16))
    with events_at(logging.INFO) as logs:
        assert core.events.before_step() is None and not core.events.on
        _agents_under_pressure(core)
    assert logs == [] and core.stats().evicted_pages > 0


def test_passivation_events_carry_the_actor_context():
    """More agents than session ids: the runtime passivates an idle agent and activates it later;
    each is an event, inside the asking actor's bound context."""
    import anyio
    from structlog.contextvars import merge_contextvars

    from agentrt import Agent, Engine, Runtime
    from tests.conftest import tiny_native_with_tokenizer

    async def main():
        cfg = EngineConfig(kv_cache_tokens=4096, max_session_seqs=2)
        async with Engine(tiny_native_with_tokenizer(), cfg) as eng, Runtime(eng) as rt:
            refs = [await rt.spawn(Agent(f"a{i}", "Answer.", settings=SamplingParams(max_tokens=4)))
                    for i in range(3)]
            for ref in refs + refs:
                await ref.ask("hi", timeout=60)

    std = logging.getLogger("agentrt.events")
    old = std.level
    std.setLevel(logging.DEBUG)
    try:
        with capture_logs(processors=[merge_contextvars]) as logs:
            anyio.run(main)
    finally:
        std.setLevel(old)
    passivated = [e for e in logs if e["event"] == "agent.passivated"]
    activated = [e for e in logs if e["event"] == "agent.activated"]
    assert passivated and activated
    assert passivated and activated and all(e["agent"] in {"a0", "a1", "a2"} for e in passivated + activated)
    # (at spawn no message is being handled); in a turn, the asked actor and its task are bound
    in_turn = [e for e in passivated + activated if "actor" in e]
    assert len(in_turn) >= 6 and all(e["task"].startswith("task-") for e in in_turn)
    assert all(e["actor"] == e["agent"] for e in in_turn if e["event"] == "agent.activated")
    assert all(e["actor"] != e["agent"] for e in in_turn if e["event"] == "agent.passivated")


def test_promotion_from_the_tier_is_an_event_and_on_the_admission():
    """Sessions' prefixes pushed out to the KV tier come back on their next turn: `kv.promoted`
    names the pages, and the admission the promoted tokens (the same count as the counters)."""
    core = EngineCore(tiny_model("llama"), EngineConfig(kv_cache_tokens=640, page_size=16,
                                                        kv_tier_bytes=64 << 20, enable_prefetch=False))
    with events_at(logging.DEBUG) as logs:
        _agents_under_pressure(core, n_agents=5, n_turns=3)
    promoted = [e for e in logs if e["event"] == "kv.promoted"]
    assert core.counters.promoted_pages > 0 and promoted
    assert sum(e["pages"] for e in promoted) == core.counters.promoted_pages
    assert sum(e["promoted_tokens"] for e in logs if e["event"] == "request.admitted") == core.counters.prompt_promoted
    core.check_invariants()
