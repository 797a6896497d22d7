"""agentrt: an in-process async actor runtime for multi-agent LLM tool calling.

Public API: the names in `__all__` (pinned by tests/test_public_api.py); everything else is
internal and may change. Internals stay importable from their modules (the reference decoder
`agentrt.model.decoder.DecoderModel`, the test oracle `agentrt.model.generate.generate`); an
agent's settings are `SamplingParams`.
"""

from agentrt import dashboard, errors, tracing
from agentrt.config import EngineConfig
from agentrt.conversation.chat_format import ChatFormat
from agentrt.conversation.conversation import Conversation, RoundEnd
from agentrt.conversation.overflow import ContextPolicy
from agentrt.conversation.repeats import CallLimits
from agentrt.engine.adapters import AdapterInfo
from agentrt.engine.engine import Completion, Engine
from agentrt.engine.like import EngineLike
from agentrt.engine.session import Session
from agentrt.engine.stats import EngineStats
from agentrt.kv.agent_aware import AgentAwarePolicy
from agentrt.kv.eviction import EvictionPolicy, LRUPolicy
from agentrt.model.config import ModelConfig
from agentrt.model.loaders.load import DEFAULT_MODEL, LoadedModel, load_model
from agentrt.records.request import TokenEvent, Usage
from agentrt.runtime.actor import ActorRef
from agentrt.runtime.agent import Agent
from agentrt.runtime.runtime import Runtime
from agentrt.runtime.spec import AgentSpec
from agentrt.runtime.supervision import Supervision
from agentrt.runtime.turn_events import TurnResult
from agentrt.sampling import SamplingParams
from agentrt.toolcall import ToolCallParser
from agentrt.toolcall.formats import ToolFormat, detect_tool_format
from agentrt.tools import Tool, ToolContext, ToolResult, Toolset, tool
from agentrt.workflow import Workflow, current_task, task_scope

__version__ = "0.1.0"

__all__ = [
    "ActorRef",
    "AdapterInfo",
    "Agent",
    "AgentAwarePolicy",
    "AgentSpec",
    "CallLimits",
    "ChatFormat",
    "Completion",
    "ContextPolicy",
    "Conversation",
    "DEFAULT_MODEL",
    "Engine",
    "EngineConfig",
    "EngineLike",
    "EngineStats",
    "EvictionPolicy",
    "LRUPolicy",
    "LoadedModel",
    "ModelConfig",
    "RoundEnd",
    "Runtime",
    "SamplingParams",
    "Session",
    "Supervision",
    "TokenEvent",
    "Tool",
    "ToolCallParser",
    "ToolContext",
    "ToolFormat",
    "ToolResult",
    "Toolset",
    "TurnResult",
    "Usage",
    "Workflow",
    "current_task",
    "dashboard",
    "detect_tool_format",
    "errors",
    "load_model",
    "task_scope",
    "tool",
    "tracing",
]
