"""The names of the pluggable policies: what EngineConfig accepts, and what the factories build
(kv/registry.py::make_policy, scheduling/policies.py::make_scheduling_policy). A module below both,
so config.py imports no implementation and no implementation imports its factory."""

EVICTION_POLICIES = ("lru", "agent_aware")
SCHEDULING_POLICIES = ("fcfs", "lpm", "srpt", "program_fcfs", "topas")
