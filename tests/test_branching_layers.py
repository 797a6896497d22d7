"""Forks above the engine: `Conversation.fork`, `Runtime.fork` (a sibling agent actor) and
`ChatAgentrt.afork` (a branched LangGraph thread). Each right after the fork shares the source's
KV pages, and continues exactly as the source would (the naive oracle, or the source itself given
the same message), prefilling only what follows the shared history. Tiny random model over
SmolLM2's tokenizer (fast)."""

from __future__ import annotations

import anyio
import pytest
from langchain_core.messages import HumanMessage, SystemMessage

from agentrt import Agent, Conversation, Engine, EngineConfig, Runtime, SamplingParams
from agentrt.conversation.conversation import RoundEnd
from agentrt.errors import ActorError, ConfigError, SessionBusy
from agentrt.integrations.langgraph import ChatAgentrt
from agentrt.model.generate import generate
from tests.conftest import tiny_model_with_tokenizer
from tests.engine_util import assert_quiescent

P = SamplingParams(max_tokens=8)
CFG = EngineConfig(kv_cache_tokens=8192, response_cache_size=0, debug_invariants=True)


def run(fn):
    async def main():
        async with Engine(tiny_model_with_tokenizer(), CFG) as eng:
            await fn(eng)
            await eng.run_in_step_thread(lambda: assert_quiescent(eng.core))
            assert not eng.core.sessions
            assert eng.core.pool.num_free("session") == CFG.max_session_seqs
    anyio.run(main)


def assert_shares_pages(eng, src_session, fork_session) -> None:
    """The fork's page table is the source's (same page ids, each held by both)."""
    src, dst = src_session._es.seq.pages, fork_session._es.seq.pages
    assert dst and dst == src[:len(dst)]
    assert all(eng.core.alloc.refcount(p) >= 2 for p in dst)
    assert fork_session.tokens == src_session.tokens


async def round_end(conv: Conversation) -> RoundEnd:
    async for ev in conv.round(P):
        if isinstance(ev, RoundEnd):
            return ev


def test_conversation_fork_shares_pages_and_each_branch_matches_the_oracle():
    lm = tiny_model_with_tokenizer()

    async def fn(eng):
        conv = Conversation(eng, session=await eng.open_session(tag="main"))
        conv.append([{"role": "system", "content": "Be terse."}, {"role": "user", "content": "hello"}])
        await round_end(conv)
        fork = await conv.fork()
        assert (fork.tokens, fork.messages, fork.ends) == (conv.tokens, conv.messages, conv.ends)
        assert fork.messages is not conv.messages and fork.messages[0] is not conv.messages[0]
        assert_shares_pages(eng, conv.session, fork.session)
        held = len(conv.session.tokens)
        for c, text in ((conv, "and then?"), (fork, "something else")):
            c.append([{"role": "user", "content": text}])
            prompt = list(c.tokens)
            end = await round_end(c)
            assert end.generated == generate(lm.model, prompt, P, eos_token_ids=lm.tokenizer.eos_token_ids)
            assert end.usage.cached_tokens >= held
        assert conv.messages[-2]["content"] == "and then?" and fork.messages[-2]["content"] == "something else"
        await conv.session.close()
        await fork.session.close()
    run(fn)


class Echo:
    async def handle(self, message, ctx):
        return message


def test_runtime_fork_spawns_a_sibling_agent_that_continues_like_its_source():
    async def fn(eng):
        async with Runtime(eng) as rt:
            src = await rt.spawn(Agent("a", "Be terse.", engine=eng, settings=P), name="a")
            await src.ask("hello")
            sib = await rt.fork(src, name="b")
            a, b = src.behavior, sib.behavior
            assert b.name == "b" and (b.tokens, b.messages) == (a.tokens, a.messages)
            assert_shares_pages(eng, a.session, b.session)
            assert eng.core.sessions[b.session._es.sid].tag == "b"
            held = len(a.session.tokens)
            answers = {}

            async def ask(ref):
                answers[ref.name] = await ref.ask("what next?")
            async with anyio.create_task_group() as tg:  # the branches run side by side
                tg.start_soon(ask, src)
                tg.start_soon(ask, sib)
            assert answers["a"].text == answers["b"].text
            assert answers["b"].usage[0].cached_tokens >= held
            with pytest.raises(ConfigError, match="name"):
                await rt.fork(src, name="b")  # taken
            with pytest.raises(ActorError):
                await rt.fork("nobody", name="c")
            with pytest.raises(ConfigError, match="agent actors"):
                await rt.fork(await rt.spawn(Echo(), name="echo"), name="c")
    run(fn)


def test_runtime_fork_refuses_a_busy_agent():
    async def fn(eng):
        async with Runtime(eng) as rt:
            long = SamplingParams(max_tokens=2000, ignore_eos=True)
            ref = await rt.spawn(Agent("a", "", engine=eng, settings=long), name="a")
            async with anyio.create_task_group() as tg:
                tg.start_soon(ref.tell, "go on and on")
                with anyio.fail_after(10):
                    while not ref.busy:
                        await anyio.sleep(0.001)
                with pytest.raises(SessionBusy, match="handling a message"):
                    await rt.fork(ref, name="b")
                ref.cancel()
            assert "b" not in rt.actors
    run(fn)


def test_chat_afork_branches_a_thread_with_shared_pages():
    async def fn(eng):
        model = ChatAgentrt(engine=eng, max_tokens=8)
        msgs = [SystemMessage("You are terse."), HumanMessage("hello there")]
        first = await model.ainvoke(msgs, session="t1/agent")
        assert await model.afork("t1", "t2") == 1
        src, dst = model.sessions["t1/agent"], model.sessions["t2/agent"]
        assert_shares_pages(eng, src.session, dst.session)
        assert dst.conversation.originals == src.conversation.originals  # the ledger came along
        held = len(src.session.tokens)
        more = msgs + [first, HumanMessage("and one more thing")]
        b = await model.ainvoke(more, session="t2/agent")
        a = await model.ainvoke(more, session="t1/agent")
        assert (b.content, b.tool_calls) == (a.content, a.tool_calls)
        assert b.usage_metadata["input_token_details"]["cache_read"] == held
        assert await model.afork("t1/agent", "t3") == 1 and "t3" in model.sessions  # an explicit key
        for src_id, dst_id in (("t1", "t1"), ("t1", "t1/x"), (3, "x"), ("t1", "")):
            with pytest.raises(ConfigError):
                await model.afork(src_id, dst_id)
        assert await model.afork("nothing", "t4") == 0
        async with src.lock:  # a call running on the source
            with pytest.raises(SessionBusy):
                await model.afork("t1", "t5")
        assert "t5/agent" not in model.sessions
        await model.arelease()
    run(fn)
