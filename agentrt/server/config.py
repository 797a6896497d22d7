"""ServerConfig: what `agentrt serve` exposes and the limits it enforces."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

from agentrt.errors import ConfigError


@dataclass(frozen=True)
class ServerConfig:
    """host: 127.0.0.1 by default (set 0.0.0.0 only behind an API key or a trusted network).
    api_keys: accepted bearer tokens (empty: no authentication). model_name: the id `/v1/models`
    lists and responses carry. Limits: request body bytes, `max_tokens` per request, concurrent
    requests per API key (429 beyond it). Sessions: the most routed conversation sessions, and
    how long an idle one keeps its KV (seconds). Responses API: the most stored responses (for
    `previous_response_id` and GET), and how long each is kept (seconds). `replicas` > 1 serves
    on that many Ray engine replicas (`threads_per_replica` torch threads each). `dashboard`: the
    live dashboard page at /dashboard/ (agentrt.dashboard; one in-process engine only)."""

    host: str = "127.0.0.1"
    port: int = 8000
    api_keys: tuple[str, ...] = ()
    model_name: str = "agentrt"
    max_request_bytes: int = 4 << 20
    max_tokens_limit: int = 4096
    max_concurrency_per_key: int = 64
    max_sessions: int = 256
    session_ttl_s: float = 900.0
    max_stored_responses: int = 4096
    response_ttl_s: float = 3600.0
    replicas: int = 1  # > 1: engine replicas on Ray (integrations/ray), conversations routed session-affine
    threads_per_replica: int = 1
    dashboard: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.host, str) or not self.host:
            raise ConfigError(f"host must be a host name or address, got {self.host!r}")
        if isinstance(self.port, bool) or not isinstance(self.port, int) or not 0 <= self.port <= 65535:
            raise ConfigError(f"port must be an int in 0..65535 (0: any free port), got {self.port!r}")
        keys = (self.api_keys,) if isinstance(self.api_keys, str) else tuple(self.api_keys)
        if not all(isinstance(k, str) and len(k) >= 8 for k in keys):
            raise ConfigError("api_keys must be strings of at least 8 characters")
        object.__setattr__(self, "api_keys", keys)
        for name in ("max_request_bytes", "max_tokens_limit", "max_concurrency_per_key", "max_sessions",
                     "max_stored_responses", "replicas", "threads_per_replica"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ConfigError(f"{name} must be an int >= 1, got {v!r}")
        if self.dashboard and self.replicas > 1:
            raise ConfigError("the dashboard shows one in-process engine: use it without replicas (Ray's own "
                              "dashboard shows replicas)")
        for name in ("session_ttl_s", "response_ttl_s"):
            if not getattr(self, name) > 0:
                raise ConfigError(f"{name} must be > 0, got {getattr(self, name)!r}")

    @property
    def public(self) -> bool:
        """Whether the server listens beyond this machine's loopback."""
        try:
            return not ipaddress.ip_address(self.host).is_loopback
        except ValueError:
            return self.host != "localhost"
