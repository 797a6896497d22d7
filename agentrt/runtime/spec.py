"""AgentSpec: an agent's definition as one frozen value.

`Agent(name, instructions, tools, **fields)` builds one and runs it; a changed definition is
`dataclasses.replace(agent.spec, ...)` run with `Agent.from_spec` (what `Agent.fresh`, `Agent.fork`
and LangGraph's `agent_node` do), so no copy of the field list exists that could drop a field.
The state an agent gathers (its session, conversation, call ids) is not part of it.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from dataclasses import KW_ONLY, dataclass, field
from typing import Any

from agentrt.checks import check_adapter_name, check_bool, check_int, check_tool_choice, set_frozen
from agentrt.conversation.overflow import ContextPolicy
from agentrt.conversation.repeats import CallLimits
from agentrt.engine.like import EngineLike
from agentrt.errors import ConfigError
from agentrt.sampling import SamplingParams
from agentrt.tools import Tool, Toolset


@dataclass(frozen=True)
class AgentSpec:
    """What an agent is. Every field is checked here (ConfigError), so `dataclasses.replace`
    checks a changed field too; the friendly forms are normalised on the way in: `tools` (Tools or
    plain functions, any iterable) -> a tuple of Tool with unique names, `stop_at_tools` -> a
    tuple, None `settings` / `context_policy` / `call_limits` -> the defaults."""

    name: str
    instructions: str = ""  # the system prompt
    tools: tuple[Tool, ...] = ()
    _: KW_ONLY
    engine: EngineLike | None = None  # None: the Runtime's engine
    settings: SamplingParams = field(default_factory=SamplingParams)  # its generation settings (None: these)
    max_tool_rounds: int = 8  # model -> tools rounds per turn; the last allowed round has tool_choice "none"
    tool_choice: Any = "auto"  # for a turn's first round; later rounds are "auto"
    constrained: bool = True  # calls written under the tool grammar
    parallel_tool_calls: bool = True
    deps: Any = None  # handed to the tools in their ToolContext
    stop_at_tools: tuple[str, ...] = ()  # the turn ends once one of these has run (handoffs)
    context_policy: ContextPolicy | None = None  # what a round does before it would not fit
    call_limits: CallLimits | None = None  # a repeated call or too many calls end a round
    adapter: str | None = None  # a LoRA adapter loaded on its engine (engine.load_adapter): its own weights

    def __post_init__(self) -> None:
        # normalised in place, as SamplingParams and EngineConfig do: a frozen value is only ever
        # seen normalised, and replace() runs this again on the changed copy
        put = functools.partial(set_frozen, self)

        self._check_identity()
        put("tools", tuple(Toolset(self.tools)))  # (Toolset: a duplicate name raises ToolDefinitionError)
        check_tool_choice(self.tool_choice, tuple(t.name for t in self.tools))
        put("settings", SamplingParams() if self.settings is None else self.settings)
        put("max_tool_rounds", check_int(f"Agent {self.name!r}: max_tool_rounds", self.max_tool_rounds, min=0))
        put("constrained", check_bool(f"Agent {self.name!r}: constrained", self.constrained))
        put("parallel_tool_calls", check_bool(f"Agent {self.name!r}: parallel_tool_calls", self.parallel_tool_calls))
        put("stop_at_tools", self._checked_stops())
        put("context_policy", ContextPolicy() if self.context_policy is None else self.context_policy)
        if not isinstance(self.context_policy, ContextPolicy):
            raise ConfigError(f"context_policy must be a ContextPolicy, got {type(self.context_policy).__name__}")
        put("call_limits", CallLimits() if self.call_limits is None else self.call_limits)
        if not isinstance(self.call_limits, CallLimits):
            raise ConfigError(f"call_limits must be a CallLimits, got {type(self.call_limits).__name__}")

    def _check_identity(self) -> None:
        """name, instructions, the shape of tools, engine and settings."""
        name, tools = self.name, self.tools
        if not isinstance(name, str) or not name:
            raise ConfigError(f"Agent name must be a non-empty str, got {name!r}")
        if not isinstance(self.instructions, str):
            raise ConfigError(f"Agent {name!r}: instructions must be a str (the system prompt), "
                              f"got {type(self.instructions).__name__}")
        if isinstance(tools, (str, bytes, Tool)) or callable(tools) or not isinstance(tools, Iterable):
            raise ConfigError(f"Agent {name!r}: tools must be a list of tools or functions, got "
                              f"{type(tools).__name__}; wrap a single one: tools=[f]")
        # an Engine or a Ray RemoteEngine (integrations/): both are EngineLike (every member present)
        if self.engine is not None and not isinstance(self.engine, EngineLike):
            raise ConfigError(f"Agent {name!r}: engine must be an Engine (or None: the Runtime's), "
                              f"got {type(self.engine).__name__}")
        check_adapter_name(f"Agent {name!r}: adapter", self.adapter)
        if self.settings is not None and not isinstance(self.settings, SamplingParams):
            raise ConfigError(f"Agent {name!r}: settings must be a GenerationSettings (SamplingParams) or None, "
                              f"got {type(self.settings).__name__}; e.g. GenerationSettings(max_tokens=256)")

    def _checked_stops(self) -> tuple[str, ...]:
        stops = self.stop_at_tools
        if isinstance(stops, (str, bytes)) or not isinstance(stops, Iterable):
            raise ConfigError(f"Agent {self.name!r}: stop_at_tools must be a list of tool names, got "
                              f"{type(stops).__name__}; wrap a single one: stop_at_tools=[name]")
        stops = tuple(stops)
        unknown = set(stops) - {t.name for t in self.tools}
        if unknown:
            raise ConfigError(f"stop_at_tools names tools the agent does not have: {sorted(unknown)}")
        return stops

    def tool_schemas(self) -> list[dict] | None:
        """The tools as OpenAI function schemas, in order (None: no tools)."""
        return [t.openai_schema() for t in self.tools] or None
