"""Device faults in a step. An out-of-memory error in the forward fails that step's requests with
DeviceOutOfMemory and halves the step size (the scheduler's, `Scheduler.shrink`); any other error
in the forward is not one request's fault, so it ends the step thread (loop.py) and every caller
gets EngineFailed naming it."""

from __future__ import annotations

import structlog
import torch

from agentrt.scheduling.admission import StepSizes

log = structlog.get_logger("agentrt.engine")


def out_of_memory(plan_tokens: int, n_requests: int, sizes: StepSizes, chunk_min: int,
                  exc: BaseException) -> tuple[StepSizes, str]:
    """The device ran out of memory in a step's forward of `plan_tokens` tokens: the halved
    sizes the engine goes on with, and the message of the DeviceOutOfMemory each of the step's
    requests fails with (their tokens were not taken: their KV holds what it held)."""
    smaller = StepSizes(max(1, min(sizes.n_batch, plan_tokens) // 2), max(chunk_min, sizes.chunk_max // 2))
    log.warning("device out of memory", requests=n_requests, tokens=plan_tokens, n_batch=smaller.n_batch,
                chunk_max=smaller.chunk_max, error=f"{type(exc).__name__}: {exc}"[:300])
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return smaller, (f"the device ran out of memory in a step of {n_requests} requests and {plan_tokens} tokens; "
                     f"the engine goes on with steps of at most {smaller.n_batch} tokens: retry the request")
