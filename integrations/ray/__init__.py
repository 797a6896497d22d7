"""agentrt.integrations.ray: agentrt past one machine (needs `agentrt[ray]`).

- `ClusterRuntime`: the `Runtime` API (spawn / ask / ask_stream) over engine replicas that are Ray
  actors; agents placed by a policy stay on their replica, move by migration (snapshot ->
  transfer -> restore) and survive a replica's death (failover).
- `EngineReplica`, `ModelSpec`: one Engine in a Ray actor, and how it loads its model.
- `RemoteEngine`, `RemoteSession`: a replica seen as an Engine from the driver.
- Placement: `round_robin`, `least_loaded`, `prefix_affine`, `session_affine` (`make_policy`).
"""

from .cluster import ClusterRuntime
from .placement import AgentInfo, PrefixAffine, ReplicaView, RoundRobin, least_loaded, make_policy, session_affine
from .remote import RemoteEngine, RemoteSession
from .replica import ConstraintSpec, EngineReplica, ModelSpec

__all__ = ["AgentInfo", "ClusterRuntime", "ConstraintSpec", "EngineReplica", "ModelSpec", "PrefixAffine",
           "RemoteEngine", "RemoteSession", "ReplicaView", "RoundRobin", "least_loaded", "make_policy",
           "session_affine"]
