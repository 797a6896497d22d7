"""The agentrt exception tree. Every public entry point raises one of these, never `assert`.

    AgentrtError
    ├── ConfigError                 bad settings or arguments given to a public API
    │   ├── SnapshotMismatch        a session snapshot from another model/dtype, or not one at all
    │   └── AdapterError            a LoRA adapter that cannot be loaded or used
    │       ├── AdapterMismatch     its targets or shapes do not fit the base model
    │       ├── UnsupportedAdapter  DoRA, a LoRA bias, modules_to_save, a PEFT type other than LoRA
    │       └── UnknownAdapter      no adapter of that name is loaded
    ├── ModelLoadError              a model could not be loaded
    │   ├── ModelNotFound           no such file / directory / named model
    │   ├── CorruptModelFile        bad magic, truncated file, checksum mismatch
    │   └── UnsupportedModel        architecture or tensor type we do not implement
    ├── TokenizerError              tokenizer missing or unusable
    ├── ChatTemplateError           a conversation that cannot be rendered
    ├── ContextLengthExceeded       prompt (+ max_tokens) longer than the model's context
    ├── ResourceError               engine resources
    │   ├── PoolExhausted           no sequence slot free before the timeout
    │   ├── OutOfKVMemory           a request can never fit in the KV pool
    │   ├── DeviceOutOfMemory       the device ran out of memory in a step (retry; steps shrink)
    │   └── StateStoreError         the durable state store cannot be opened or written
    ├── EngineClosed                the engine was shut down
    │   └── EngineFailed            the engine's step thread stopped on an internal error
    ├── SessionBusy                 a session with a turn running cannot be forked/rolled back/saved
    ├── RequestCancelled            a request was cancelled before it finished
    ├── GenerationTimeout           a generation ran past its caller's timeout (it was cancelled)
    ├── ReplicaLost                 a cluster replica died with the turn in flight (ask again)
    ├── ToolError                   tool definition or dispatch problems
    │   ├── ToolDefinitionError     a function that cannot become a tool
    │   └── ToolCallError           a call that failed validation or execution
    ├── GrammarError                constrained decoding could not be set up
    │   └── SchemaUnsupported       a tool's parameters or a response schema the backend cannot compile
    └── ActorError                  actor runtime problems
        ├── MailboxFull             tell_nowait on a full mailbox
        ├── ActorStopped            message sent to a stopped actor
        ├── AskTimeout              ask() did not get an answer in time
        └── AskCycle                ask() of an actor already waiting up the caller's chain of asks
"""

from __future__ import annotations


class AgentrtError(Exception):
    """Base class of every error agentrt raises on purpose."""


class ConfigError(AgentrtError, ValueError):
    """A setting or argument is invalid; the message names it and the accepted values."""


class SnapshotMismatch(ConfigError):
    """A session snapshot cannot be restored on this engine: it was written by another model
    (architecture or weights) or dtype, it is not an agentrt snapshot (corrupt, foreign, another
    format version), or there is no file. The message names what differs; restore it on an
    engine running the model that wrote it, or start a fresh session."""


class ModelLoadError(AgentrtError):
    """A model could not be loaded."""


class ModelNotFound(ModelLoadError, FileNotFoundError):
    """The model file, directory or embedded name does not exist."""


class CorruptModelFile(ModelLoadError):
    """The model file exists but is not a valid model (bad header, truncated, wrong checksum)."""


class UnsupportedModel(ModelLoadError):
    """The model's architecture or tensor type is not implemented."""


class TokenizerError(AgentrtError):
    """The tokenizer is missing or cannot be built."""


class AdapterError(ConfigError):
    """A LoRA adapter cannot be loaded or used; the message names the file or the adapter and
    what to do."""


class AdapterMismatch(AdapterError):
    """The adapter was made for another base model: a target module or a matrix shape that the
    loaded model does not have. Load it on the model it was trained on."""


class UnsupportedAdapter(AdapterError):
    """An adapter kind agentrt does not run: DoRA, LoRA biases, modules_to_save, embedding or
    lm_head targets, or a PEFT type other than LoRA. Merge it into the weights instead."""


class UnknownAdapter(AdapterError, LookupError):
    """No adapter of that name is loaded (`engine.adapters()` lists those that are)."""


class ChatTemplateError(AgentrtError):
    """A conversation cannot be rendered with the model's chat template."""


class ContextLengthExceeded(AgentrtError, ValueError):
    """A prompt plus its max_tokens does not fit in the model's context window."""


class ResourceError(AgentrtError):
    """Engine resources (sequence slots, KV memory) are short."""


class PoolExhausted(ResourceError, TimeoutError):
    """No sequence slot became free before the acquire timeout."""


class OutOfKVMemory(ResourceError):
    """A request needs more KV pages than the whole pool holds."""


class DeviceOutOfMemory(ResourceError):
    """The device (a GPU) ran out of memory during a step: that step's requests fail with this,
    the engine halves its step size and goes on. Retry the request; if it recurs, lower
    `EngineConfig.kv_cache_tokens` or `n_batch`."""


class StateStoreError(ResourceError):
    """The durable state store (`EngineConfig.state_dir` / `state_url`, agentrt/state) cannot be
    opened or written: a directory that cannot be created, a database that refuses the
    connection, psycopg missing for a postgresql:// URL. The message says which and what to do."""


class EngineClosed(AgentrtError, RuntimeError):
    """The engine was closed; create a new one."""


class EngineFailed(EngineClosed):
    """The engine's step thread stopped on an internal error (a bug, not one request's fault):
    every pending and later call gets this at once. The log has the cause; create a new Engine."""


class SessionBusy(AgentrtError, RuntimeError):
    """The session has a turn running (a request on it is queued or generating), so it cannot be
    forked, rolled back or snapshotted now: its KV is changing. Wait for the turn to finish (read
    its stream to the end, or await complete()), then retry."""


class RequestCancelled(AgentrtError):
    """The request was cancelled before it finished."""


class GenerationTimeout(AgentrtError, TimeoutError):
    """A generation ran past the timeout its caller set; it was cancelled and nothing was kept."""


class ReplicaLost(AgentrtError):
    """The engine replica serving an agent died (agentrt.integrations.ray). The turn in flight is
    lost; the conversation is not: the cluster restores the agent on another replica, so asking
    again continues it."""


class ToolError(AgentrtError):
    """Tool definition or dispatch problems."""


class ToolDefinitionError(ToolError, TypeError):
    """A Python function cannot be turned into a tool (e.g. missing type hints)."""


class ToolCallError(ToolError):
    """A tool call failed validation or execution."""


class GrammarError(AgentrtError):
    """Constrained decoding could not be set up for the given tools or schema."""


class SchemaUnsupported(GrammarError):
    """A schema the grammar backend cannot compile: `tool` names the tool whose parameters hold
    it (None: the response format's schema), `feature` the keyword at fault and where, when the
    backend's message points at one ("$ref at /properties/city/$ref")."""

    def __init__(self, message: str, *, tool: str | None = None, feature: str | None = None) -> None:
        super().__init__(message)
        self.tool, self.feature = tool, feature


class ActorError(AgentrtError):
    """Actor runtime problems."""


class MailboxFull(ActorError):
    """tell_nowait() found the actor's mailbox full; use tell() to wait for space."""


class ActorStopped(ActorError):
    """The actor has stopped and takes no more messages."""


class AskTimeout(ActorError, TimeoutError):
    """ask() got no answer within its timeout."""


class AskCycle(ActorError):
    """ask() would wait on an actor that is itself waiting, up the chain of asks, for the caller
    (an agent asking itself from a tool, or A -> B -> A): it could never be answered."""


__all__ = [name for name, obj in list(globals().items()) if isinstance(obj, type) and issubclass(obj, AgentrtError)]
