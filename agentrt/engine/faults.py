"""Device faults in a step. An out-of-memory error in the forward fails that step's requests with
DeviceOutOfMemory and halves the step size; any other error in the forward is not one request's
fault, so it ends the step thread (loop.py) and every caller gets EngineFailed naming it."""

from __future__ import annotations

from dataclasses import replace

import structlog
import torch

from agentrt.errors import DeviceOutOfMemory

log = structlog.get_logger("agentrt.engine")


def out_of_memory(core, plan: list, exc: BaseException) -> None:
    """The device ran out of memory in this step's forward: its requests fail (their tokens
    were not taken: their KV holds what it held), the step size halves, the engine goes on."""
    tokens = sum(n for _, n in plan)
    cfg = core.cfg
    smaller = replace(cfg, n_batch=max(1, min(cfg.n_batch, tokens) // 2),
                      chunk_max=max(cfg.chunk_min, cfg.chunk_max // 2))
    core.cfg = core.scheduler.cfg = smaller
    core.counters.oom_steps += 1
    log.warning("device out of memory", requests=len(plan), tokens=tokens, n_batch=smaller.n_batch,
                chunk_max=smaller.chunk_max, error=f"{type(exc).__name__}: {exc}"[:300])
    for r, _ in plan:
        core.fail(r, DeviceOutOfMemory(
            f"the device ran out of memory in a step of {len(plan)} requests and {tokens} tokens; the "
            f"engine goes on with steps of at most {smaller.n_batch} tokens: retry the request"))
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
