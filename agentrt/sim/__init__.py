"""Simulation: the engine core's real admission, scheduling, caching, eviction, tier, retention,
prefetch and preemption code over a cost model instead of a model, on a virtual clock.

    from agentrt.sim import SimExecutor, SimModel, StepCosts, ScriptBook, run
    costs = StepCosts.load("bench/costs/gpu_llama3_8b_h100.json")
    engine = Engine(SimModel(model_cfg), config, executor=SimExecutor(SimModel(model_cfg), costs))
    run(main)   # an asyncio loop with a virtual clock: tool sleeps and step costs take no real time
"""

from __future__ import annotations

from agentrt.sim.costs import StepCosts
from agentrt.sim.executor import SimExecutor, SimModel, SimTier
from agentrt.sim.loop import SimSteps
from agentrt.sim.run import run
from agentrt.sim.scripts import ScriptBook

__all__ = ["ScriptBook", "SimExecutor", "SimModel", "SimSteps", "SimTier", "StepCosts", "run"]
