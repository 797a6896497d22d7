"""ServerConfig: what `agentrt serve` exposes and the limits it enforces."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

from agentrt.checks import check_bool, check_float, check_int, set_frozen
from agentrt.errors import ConfigError

# the limits that count something: ints >= 1
_COUNTS = ("max_request_bytes", "max_tokens_limit", "max_concurrency_per_key", "max_sessions", "max_stored_responses",
           "replicas", "threads_per_replica")


@dataclass(frozen=True)
class ServerConfig:
    """host: 127.0.0.1 by default (set 0.0.0.0 only behind an API key or a trusted network).
    api_keys: accepted bearer tokens (empty: no authentication). model_name: the id `/v1/models`
    lists and responses carry. Limits: request body bytes, `max_tokens` per request, concurrent
    requests per API key (429 beyond it). Sessions: the most routed conversation sessions, and
    how long an idle one keeps its KV (seconds). Responses API: the most stored responses (for
    `previous_response_id` and GET), and how long each is kept (seconds). `replicas` > 1 serves
    on that many Ray engine replicas (`threads_per_replica` torch threads each). `dashboard`: the
    live dashboard page at /dashboard/ (agentrt.dashboard; one in-process engine only).
    `any_model`: answer whatever `model` a request names (clients that send a fixed name); by
    default a name other than `model_name` is a 404, as vLLM and Ollama answer. `adapters`:
    (name, path) of LoRA adapters loaded at start; a request naming one as its `model` runs it
    (vLLM's convention), and `/v1/models` lists them after the base model."""

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
    any_model: bool = False
    adapters: tuple[tuple[str, str], ...] = ()

    def __post_init__(self) -> None:
        if not isinstance(self.host, str) or not self.host:
            raise ConfigError(f"host must be a host name or address, got {self.host!r}")
        self._set("port", check_int("port", self.port, min=0, max=65535))
        self._set("api_keys", _api_keys(self.api_keys))
        for name in _COUNTS:
            self._set(name, check_int(name, getattr(self, name), min=1))
        if self.dashboard and self.replicas > 1:
            raise ConfigError("the dashboard shows one in-process engine: use it without replicas (Ray's own "
                              "dashboard shows replicas)")
        for name in ("session_ttl_s", "response_ttl_s"):
            self._set(name, check_float(name, getattr(self, name), min=0.0, min_open=True, allow_inf=True))
        self._set("any_model", check_bool("any_model", self.any_model))
        self._set("adapters", _adapters(self.adapters, self.model_name))

    def served_model(self, requested: str | None) -> str:
        """The model id a response carries for a request naming `requested`; ApiError 404 (in
        each protocol's own error shape) for a model this server does not serve."""
        if requested is not None and requested in dict(self.adapters):
            return requested
        if requested is None or requested == self.model_name or self.any_model:
            return self.model_name
        from agentrt.server.protocol import ApiError

        raise ApiError(f"the model {requested!r} does not exist on this server: it serves {self.model_name!r} "
                       "(GET /v1/models lists it; `agentrt serve --any-model` answers any name)", 404,
                       param="model", code="model_not_found")

    def adapter_of(self, model: str | None) -> str | None:
        """The adapter a request for `model` (served_model's answer) runs; None: the base model."""
        return model if model is not None and model in dict(self.adapters) else None

    def _set(self, name: str, value) -> None:
        set_frozen(self, name, value)

    @property
    def public(self) -> bool:
        """Whether the server listens beyond this machine's loopback."""
        try:
            return not ipaddress.ip_address(self.host).is_loopback
        except ValueError:
            return self.host != "localhost"


def _api_keys(keys) -> tuple[str, ...]:
    keys = (keys,) if isinstance(keys, str) else tuple(keys)
    if not all(isinstance(k, str) and len(k) >= 8 for k in keys):
        raise ConfigError("api_keys must be strings of at least 8 characters")
    return keys


def _adapters(value, model_name: str) -> tuple[tuple[str, str], ...]:
    pairs = tuple(tuple(x) for x in value) if isinstance(value, (list, tuple)) else None
    if pairs is None or not all(len(x) == 2 and all(isinstance(s, str) and s for s in x) for x in pairs):
        raise ConfigError(f"adapters must be (name, path) pairs of non-empty strings, got {value!r}")
    names = [n for n, _ in pairs]
    if len(set(names)) != len(names) or model_name in names:
        raise ConfigError(f"adapter names must be unique and differ from the model's ({model_name!r}), got {names}")
    return pairs
