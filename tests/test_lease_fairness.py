"""Session ids are handed to waiting agents in arrival order, one queue per engine
(runtime/leases.py), with passivation as before. The engine here is a stand-in with a pool of ids
whose close frees an id one scheduling point later, as the real step thread does; the leases are
the real SessionLeases."""

from __future__ import annotations

from types import SimpleNamespace

import anyio
import pytest

from agentrt.errors import PoolExhausted
from agentrt.runtime.leases import SessionLeases


class _Session:
    def __init__(self, engine):
        self.engine, self.closed = engine, False

    async def close(self):
        await anyio.sleep(0)  # (the close crosses to the step thread and back)
        self.closed = True
        self.engine.free += 1


class _Engine:
    state_store = None  # (no durable state: agentrt/runtime/persist.py)

    def __init__(self, ids: int, acquire_timeout: float = 5.0):
        self.free = ids
        self.config = SimpleNamespace(max_session_seqs=ids, acquire_timeout=acquire_timeout)

    async def open_session(self, tag=None, timeout=None, key=None):
        if not self.free:
            raise PoolExhausted("no session sequence slot free")
        self.free -= 1
        return _Session(self)


class _Agent:
    def __init__(self, name: str, engine: _Engine):
        self.spec, self.engine = SimpleNamespace(name=name), engine
        self.session = None
        self.conversation = SimpleNamespace(session=None, tokens=[1, 2, 3])

    def attach(self, session):
        self.session = self.conversation.session = session

    async def passivate(self):
        session, self.session = self.session, None
        self.conversation.session = None
        await session.close()


def test_a_waiting_agent_is_served_before_one_that_comes_later():
    """One id, held by a busy agent; `first` waits for it. The holder's turn ends and, at that
    moment, `late` asks too: `first` gets the id (passivating the holder), `late` the next one.
    (Without the queue `late` passivated the holder and took its id while `first` was asleep.)"""
    order: list[str] = []

    async def main():
        eng, leases = _Engine(1), SessionLeases()
        holder, first, late = (_Agent(n, eng) for n in ("holder", "first", "late"))

        async def turn(agent):
            await leases.acquire(agent)
            order.append(agent.spec.name)
            await anyio.sleep(0.05)
            leases.release(agent)

        with anyio.fail_after(10):
            await leases.acquire(holder)  # busy: no release yet
            async with anyio.create_task_group() as tg:
                tg.start_soon(turn, first)
                await anyio.sleep(0.05)  # (first is waiting: nothing is idle)
                leases.release(holder)
                await turn(late)  # late asks before first has run again
        assert leases.passivations == 2

    anyio.run(main)
    assert order == ["first", "late"]


@pytest.mark.parametrize("n", [8])
def test_waiters_are_served_in_arrival_order_and_time_out_in_line(n):
    """n agents queue on one id held by a busy agent: each, as the previous finishes its turn,
    gets it in the order they came; an agent that waits past acquire_timeout gets PoolExhausted
    and leaves the line without blocking the ones behind it."""
    order: list[str] = []

    async def main():
        eng, leases = _Engine(1, acquire_timeout=2.0), SessionLeases()
        holder = _Agent("holder", eng)
        agents = [_Agent(f"w{i}", eng) for i in range(n)]

        async def turn(agent):
            try:
                await leases.acquire(agent)
            except PoolExhausted:
                order.append(f"{agent.spec.name}:timeout")
                return
            order.append(agent.spec.name)
            await anyio.sleep(0.01)
            leases.release(agent)

        with anyio.fail_after(20):
            await leases.acquire(holder)
            async with anyio.create_task_group() as tg:
                for a in agents:
                    tg.start_soon(turn, a)
                    await anyio.sleep(0.01)
                await anyio.sleep(2.5)  # everyone waited past the timeout: all give up in line
            assert order == [f"w{i}:timeout" for i in range(n)]
            order.clear()
            leases.release(holder)
            async with anyio.create_task_group() as tg:
                for a in agents:
                    tg.start_soon(turn, a)
                    await anyio.sleep(0.01)
        assert not leases._queues

    anyio.run(main)
    assert order == [f"w{i}" for i in range(n)]


def test_the_engines_session_pool_serves_waiters_in_arrival_order():
    """The real SequencePool under direct open_session callers (outside any runtime): a burst of
    callers onto one free id gets it one by one in the order they asked, later callers never
    overtake, a timeout=0 ask while others wait is refused, and a cancelled waiter leaves the line."""
    from agentrt import Engine, EngineConfig
    from tests.conftest import tiny_model

    got: list[int] = []

    async def main():
        async with Engine(tiny_model(), EngineConfig(max_session_seqs=1, acquire_timeout=30)) as eng:
            holder = await eng.open_session()

            async def ask(i: int) -> None:
                s = await eng.open_session()
                got.append(i)
                await anyio.sleep(0.01)
                await s.close()

            async with anyio.create_task_group() as tg:
                for i in range(6):
                    tg.start_soon(ask, i)
                    await anyio.sleep(0.005)  # (arrival order 0..5)
                with anyio.CancelScope() as scope:  # a seventh waits, then gives up
                    scope.cancel()
                    await eng.open_session()
                with pytest.raises(PoolExhausted):
                    await eng.open_session(timeout=0.0)  # would overtake the six in line
                await holder.close()
            assert eng.core.pool.num_free("session") == 1
            assert not eng.core.pool._line["session"]

    anyio.run(main)
    assert got == list(range(6))
