"""What the dashboard shows, read from the engine core (between two steps, `Engine.inspect`) and
the runtime, as JSON-ready dicts. The numbers are `stats()`'s own (`EngineStats`, whole); the
rest is what stats() sums: each session's pages, the radix tree's pages by agent, the tasks
in flight per workflow stage, the runtime's actors. Reads only: nothing is locked, touched or
evicted.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from typing import Any

from agentrt.runtime.agent import Agent
from agentrt.scheduling.scheduler import UPCOMING_S

RECENT_TASKS = 256  # tasks looked at for the workflow view (most recently seen first)


def engine_state(core: Any) -> dict:
    """The core's part of a snapshot; call under the step lock (Engine.inspect)."""
    now = core.clock.now()
    return {"stats": _clean(dataclasses.asdict(core.stats())),
            "page_size": core.cfg.page_size,
            "sessions": [_session(core, s, now) for s in list(core.kv.sessions.values())],
            "tree": _tree_by_agent(core.kv.radix),
            "workflows": _workflows(core.tasks, now)}


def _session(core: Any, es: Any, now: float) -> dict:
    """One session: tokens held, and its history's pages resident (its page table), demoted
    (continuing its match in the tier) or dropped (neither: recomputed at its next turn)."""
    ps, radix = core.cfg.page_size, core.kv.radix
    hist = es.history if len(es.history) >= len(es.seq.tokens) else es.seq.tokens
    resident = len(es.seq.pages)
    total = -(-len(hist) // ps)
    demoted = 0
    if radix is not None and radix.tier is not None and resident < total:
        demoted = sum(len(n.key) for n in radix.host_path(hist, es.space)) // ps
    return {"session": es.sid, "agent": es.tag, "tokens": len(es.seq.tokens), "history_tokens": len(hist),
            "resident_pages": resident, "demoted_pages": min(demoted, max(0, total - resident)),
            "dropped_pages": max(0, total - resident - demoted), "busy": es.busy,
            "pinned_s": max(0.0, es.pin_until - now), "tools": list(es.tools)}


def _tree_by_agent(radix: Any) -> dict:
    """agent tag -> [resident pages, demoted pages] of the radix tree's nodes."""
    out: dict[str, list[int]] = {}
    if radix is None:
        return out
    ps = radix.ps
    for node in radix.nodes():
        if node.parent is None:
            continue
        row = out.setdefault(node.tag or "(untagged)", [0, 0])
        if node.resident:
            row[0] += len(node.pages)
        elif node.host is not None:
            row[1] += len(node.key) // ps
    return out


def _workflows(tasks: Any, now: float) -> list[dict]:
    """Each workflow's DAG (declared, and the learned one) with the recent tasks at each stage:
    [running a request, between requests] -- the second, tasks whose last request ended within
    the scheduler's UPCOMING_S (running a tool, or about to enter the next stage: what the
    scheduler expects back; a finished task looks the same until then)."""
    graphs = dict(tasks.workflows)
    if tasks.learned.edges:
        graphs.setdefault("learned", tasks.learned.workflow())
    counts: dict[str, dict[str, list[int]]] = {name: {} for name in graphs}
    for t in itertools.islice(reversed(tasks.tasks.values()), RECENT_TASKS):
        name = t.workflow if t.workflow in graphs else "learned"
        if t.stage is None or name not in counts:
            continue
        row = counts[name].setdefault(t.stage, [0, 0])
        if t.live:
            row[0] += 1
        elif now - t.idle_since < UPCOMING_S:
            row[1] += 1
    return [{"name": name, "stages": list(wf.stages), "edges": [[a, b] for a, succ in wf.edges.items() for b in succ],
             "tasks": counts[name]} for name, wf in graphs.items()]


def runtime_state(runtime: Any) -> list[dict]:
    """The runtime's actors: busy or idle, mailbox depth, and an agent's session (None:
    passivated or not started) and tokens held."""
    rows = []
    for name, ref in list(runtime.actors.items()):
        agent = ref.behavior
        session, conv = (agent.session, agent.conversation) if isinstance(agent, Agent) else (None, None)
        es = session.engine_session if session is not None else None
        rows.append({"name": name, "busy": ref.busy, "stopped": ref.stopped, "queued": ref.queued,
                     "kind": type(agent).__name__, "session": es.sid if es is not None else None,
                     "tokens": len(conv.tokens) if conv is not None else 0})
    return rows


def point(t: float, stats: dict) -> dict:
    """One sample of the series the charts draw (KV pool and tier, hit rate, queues)."""
    total = stats["pages_total"]
    used = total - stats["pages_free"]
    return {"t": t, "pages_used": used - stats["pages_cached_only"], "pages_cached": stats["pages_cached_only"],
            "pages_free": stats["pages_free"], "tier_pages": stats["tier_pages"], "hit_rate": stats["hit_rate"],
            "waiting": stats["waiting"], "running": stats["running"], "decode_tokens": stats["decode_tokens"]}


def _clean(d: dict) -> dict:
    """Non-finite floats as None (JSON has no inf or NaN)."""
    return {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in d.items()}
