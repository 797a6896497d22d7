"""ChatAgentrt: a LangChain chat model on an agentrt Engine, with a KV session per LangGraph
thread and node.

    async with Engine(load_model("smollm2-135m")) as engine:
        model = ChatAgentrt(engine=engine)
        agent = create_agent(model, [get_weather], checkpointer=InMemorySaver())  # langchain.agents
        await agent.ainvoke({"messages": [...]}, {"configurable": {"thread_id": "t1"}})

or `ChatAgentrt.from_model("smollm2-135m")`, which runs its own engine on a private event loop
(then the sync `invoke`/`stream` work from any thread). Each call carries its task and stage
(workflow.py): the enclosing `agentrt.task_scope`, else the graph run it is made in; the stage is
the model's `name` if set, else the LangGraph node's name. Every path is built on `_astream`:
`_agenerate` aggregates its chunks; the sync paths run it on the engine's loop.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator, Sequence
from typing import Any

from langchain_core.callbacks import AsyncCallbackManagerForLLMRun, CallbackManagerForLLMRun
from langchain_core.language_models import ModelProfile
from langchain_core.language_models.chat_models import BaseChatModel
from langchain_core.messages import BaseMessage
from langchain_core.outputs import ChatGenerationChunk, ChatResult
from langchain_core.runnables import Runnable
from langchain_core.runnables.config import ensure_config
from langchain_core.utils import secret_from_env
from pydantic import ConfigDict, Field, PrivateAttr, SecretStr, ValidationError

from agentrt import tracing
from agentrt.conversation.engine_text import chat_format_of
from agentrt.conversation.repeats import CallLimits
from agentrt.engine.like import EngineLike
from agentrt.errors import ConfigError
from agentrt.sampling import SamplingParams

from .host import EngineHost
from .messages import normalize_tool_choice, to_openai, tools_to_openai
from .remote import RemoteServer
from .sessions import SessionPolicy, SessionRouter, call_session, routed_kwargs
from .stream import CallSpec, aggregate, run_call
from .structured import check_strict, response_schema, structured_output
from .tasks import GraphTasks, node_name

_CALL_KWARGS = {"tools", "tool_choice", "parallel_tool_calls", "response_format", "max_tokens", "temperature",
                "top_p", "top_k", "seed", "stream", "ls_structured_output_format", "session", "strict"}


class _Shared:
    """State shared by a model and its bound copies: chat format, session router (the grammar
    factory is the engine's, built on the first constrained call)."""

    def __init__(self, host: EngineHost, policy: SessionPolicy):
        engine = host.engine
        if engine.tokenizer is None:
            raise ConfigError("the engine has no tokenizer: build it from load_model(...)")
        self.host = host
        self.fmt = chat_format_of(engine)  # the engine's template and tool-call format
        self.router = SessionRouter(engine, policy)
        self.tasks = GraphTasks()


class ChatAgentrt(BaseChatModel):
    """A LangChain chat model served by an agentrt engine (see the module docstring)."""

    # unknown constructor arguments are refused (a silently dropped `stop=` is a wrong answer later)
    model_config = ConfigDict(arbitrary_types_allowed=True, extra="forbid")

    # strict: "5" or True is not a max_tokens; the ranges (finite temperature, top_p in (0, 1], ...)
    # are SamplingParams' own checks, run at construction and for each call's overrides
    model_name: str = Field(default="agentrt", strict=True)
    temperature: float = Field(default=0.0, strict=True)
    max_tokens: int = Field(default=512, strict=True)
    top_p: float = Field(default=1.0, strict=True)
    top_k: int = Field(default=0, strict=True)
    seed: int | None = Field(default=None, strict=True)
    adapter: str | None = Field(default=None, min_length=1, strict=True,
                                description="a LoRA adapter loaded on the engine (engine.load_adapter); a remote "
                                            "server gets it as `model`, as vLLM names adapters")
    constrained: bool = Field(default=True, strict=True, description="tool calls and JSON under a grammar")
    parallel_tool_calls: bool = Field(default=True, strict=True)
    stop: list[str] | None = Field(default=None, description="stop strings of every call (a call's own replace them)")
    timeout: float | None = Field(default=None, gt=0, description="seconds one call may run (GenerationTimeout)")
    max_retries: int = Field(default=0, ge=0, strict=True,
                             description="attempts again after a transient failure before the first token")
    streaming: bool = Field(default=False, strict=True, description="invoke() runs through the streaming path")
    max_parallel_calls: int | None = Field(default=16, ge=1, strict=True,
                                           description="the most tool calls in one reply (None: no cap)")
    stop_on_repeated_call: bool = Field(default=True, strict=True,
                                        description="a reply ends when the model repeats one of its calls")
    session_policy: SessionPolicy = Field(default_factory=SessionPolicy)
    api_key: SecretStr | None = Field(
        default_factory=secret_from_env("AGENTRT_API_KEY", default=None),
        description="the bearer key of a remote `agentrt serve` (env AGENTRT_API_KEY); an in-process "
                    "engine has no credentials and does not use it")
    base_url: str | None = Field(default=None, description="a remote `agentrt serve` (http://host:port/v1) "
                                                           "instead of an in-process engine")
    _shared: _Shared | None = PrivateAttr(default=None)
    _remote: RemoteServer | None = PrivateAttr(default=None)

    def __init__(self, engine: EngineLike | None = None, *, host: EngineHost | None = None, **kwargs: Any):
        try:
            super().__init__(**kwargs)
        except ValidationError as e:
            raise ConfigError(f"ChatAgentrt: {_errors(e)}") from None
        if (engine is None) + (host is None) + (self.base_url is None) != 2:
            raise ConfigError("pass engine= (an Engine), base_url= (a remote agentrt serve), or use "
                              "ChatAgentrt.from_model(source)")
        # an Engine or a Ray RemoteEngine: both are EngineLike (every member present)
        if engine is not None and not isinstance(engine, EngineLike):
            raise ConfigError(f"engine must be an agentrt Engine, got {type(engine).__name__}")
        SamplingParams(max_tokens=self.max_tokens, temperature=self.temperature, top_p=self.top_p,
                       top_k=self.top_k, seed=self.seed)  # validates (ConfigError)
        if self.base_url is not None:
            key = self.api_key.get_secret_value() if self.api_key is not None else None
            self._remote = RemoteServer(self.base_url, key)
            return
        if host is None:
            if engine is None:  # (the count above leaves engine= when there is no host=)
                raise ConfigError("pass engine= (an Engine) or base_url= (a remote agentrt serve)")
            host = EngineHost(engine)
        self._shared = _Shared(host, self.session_policy)
        if self.profile is None:
            self.profile = _profile(self._shared.host.engine, self.max_tokens)

    @classmethod
    def from_model(cls, source: str = "smollm2-135m", *, config=None, quantize: str = "auto",
                   **kwargs: Any) -> "ChatAgentrt":
        """Load a model and run its engine on a private event loop (close() stops it)."""
        from agentrt.engine.engine import Engine
        from agentrt.model.loaders.load import load_model

        lm = load_model(source, quantize=quantize)
        host = EngineHost.start(lambda: Engine(lm, config))
        return cls(host=host, model_name=kwargs.pop("model_name", str(source)), **kwargs)

    @property
    def engine(self) -> EngineLike | None:
        """The in-process engine (None for a remote ChatAgentrt)."""
        return None if self._shared is None else self._shared.host.engine

    @property
    def _llm_type(self) -> str:
        return "agentrt"

    @property
    def _identifying_params(self) -> dict[str, Any]:
        return {"model_name": self.model_name, "temperature": self.temperature, "max_tokens": self.max_tokens}

    # ---- entry points: a run config's thread reaches the call ------------------------------
    # (BaseChatModel passes only callbacks, tags and metadata on; outside a LangGraph node, where
    # the node's config is the context's, `invoke(msgs, {"configurable": {"thread_id": ...}})`
    # would otherwise be a transient call)
    def invoke(self, input: Any, config: Any = None, *, stop: list[str] | None = None, **kwargs: Any) -> Any:
        return super().invoke(input, config, stop=stop, **routed_kwargs(config, kwargs))

    async def ainvoke(self, input: Any, config: Any = None, *, stop: list[str] | None = None, **kwargs: Any) -> Any:
        return await super().ainvoke(input, config, stop=stop, **routed_kwargs(config, kwargs))

    def stream(self, input: Any, config: Any = None, *, stop: list[str] | None = None, **kwargs: Any) -> Any:
        yield from super().stream(input, config, stop=stop, **routed_kwargs(config, kwargs))

    async def astream(self, input: Any, config: Any = None, *, stop: list[str] | None = None,
                      **kwargs: Any) -> AsyncIterator[Any]:
        async for chunk in super().astream(input, config, stop=stop, **routed_kwargs(config, kwargs)):
            yield chunk

    # ---- the one generation path --------------------------------------------------------
    async def _astream(self, messages: list[BaseMessage], stop: list[str] | None = None,
                       run_manager: AsyncCallbackManagerForLLMRun | None = None,
                       **kwargs: Any) -> AsyncIterator[ChatGenerationChunk]:
        spec, sh = self._call(messages, stop, kwargs)
        chunks = self._server().astream(spec) if sh is None else \
            sh.host.astream(lambda: run_call(spec, sh.host.engine, sh.fmt, sh.router))
        async for chunk in chunks:
            if run_manager is not None:
                await run_manager.on_llm_new_token(chunk.text, chunk=chunk)
            yield chunk

    async def _agenerate(self, messages: list[BaseMessage], stop: list[str] | None = None,
                         run_manager: AsyncCallbackManagerForLLMRun | None = None, **kwargs: Any) -> ChatResult:
        chunks = [c async for c in self._astream(messages, stop, run_manager, **kwargs)]
        return aggregate(chunks)

    def _stream(self, messages: list[BaseMessage], stop: list[str] | None = None,
                run_manager: CallbackManagerForLLMRun | None = None, **kwargs: Any) -> Iterator[ChatGenerationChunk]:
        spec, sh = self._call(messages, stop, kwargs)
        chunks = self._server().stream(spec) if sh is None else \
            sh.host.stream(lambda: run_call(spec, sh.host.engine, sh.fmt, sh.router))
        for chunk in chunks:
            if run_manager is not None:
                run_manager.on_llm_new_token(chunk.text, chunk=chunk)
            yield chunk

    def _generate(self, messages: list[BaseMessage], stop: list[str] | None = None,
                  run_manager: CallbackManagerForLLMRun | None = None, **kwargs: Any) -> ChatResult:
        return aggregate(list(self._stream(messages, stop, run_manager, **kwargs)))

    def _call(self, messages: list[BaseMessage], stop: list[str] | None,
              kwargs: dict) -> tuple[CallSpec, _Shared | None]:
        """The call's spec with its task and trace context (resolved here, on the caller's side: the
        engine's loop may run in another thread, where the caller's task_scope and span are not seen)."""
        spec, sh = self._spec(messages, stop, kwargs), self._shared
        if sh is not None:
            spec.task = sh.tasks.context(ensure_config())
            spec.trace = tracing.capture()
        return spec, sh

    def _spec(self, messages: list[BaseMessage], stop: list[str] | None, kwargs: dict) -> CallSpec:
        unknown = set(kwargs) - _CALL_KWARGS
        if unknown:
            raise ConfigError(f"unsupported call arguments {sorted(unknown)}; supported: {sorted(_CALL_KWARGS)}")
        tools = kwargs.get("tools") or None
        choice = kwargs.get("tool_choice") or "auto"
        if tools is None and choice not in ("auto", "none"):
            raise ConfigError(f"tool_choice {choice!r} needs tools: use bind_tools(tools, tool_choice=...)")
        stop = self.stop if stop is None else stop
        if stop is not None and (isinstance(stop, str) or not all(isinstance(s, str) and s for s in stop)):
            raise ConfigError("stop must be a list of non-empty strings")
        strict = check_strict(kwargs.get("strict"))
        params = SamplingParams(
            max_tokens=kwargs.get("max_tokens", self.max_tokens), temperature=kwargs.get("temperature", self.temperature),
            top_p=kwargs.get("top_p", self.top_p), top_k=kwargs.get("top_k", self.top_k), seed=kwargs.get("seed", self.seed))
        config = ensure_config()
        return CallSpec(
            messages=to_openai(messages), tools=tools, tool_choice=choice,
            parallel_tool_calls=kwargs.get("parallel_tool_calls", self.parallel_tool_calls),
            constrained=self.constrained if strict is None else strict,
            json_schema=response_schema(kwargs.get("response_format")), params=params,
            stop=tuple(stop or ()), key=call_session(kwargs.get("session"), config), model_name=self.model_name,
            tag=self.name or node_name(config), timeout=self.timeout, retries=self.max_retries,
            limits=CallLimits(self.stop_on_repeated_call, self.max_parallel_calls),
            model_named="model_name" in self.model_fields_set, adapter=self.adapter)

    # ---- binding -------------------------------------------------------------------------
    def bind_tools(self, tools: Sequence[Any], *, tool_choice: Any = None, strict: bool | None = None,
                   parallel_tool_calls: bool | None = None, **kwargs: Any) -> Runnable:
        """Bind LangChain tools, pydantic models, functions or OpenAI tool dicts (the same tool
        given twice is bound once). tool_choice: "auto" (default), "any"/"required", "none", or a
        tool name; under the grammar (`constrained`, or strict=True for these tools) the choice
        and the arguments' schema are enforced; strict=False decodes the calls freely."""
        formatted = tools_to_openai(tools, strict=check_strict(strict))
        bound = {"tools": formatted, "tool_choice": normalize_tool_choice(tool_choice, formatted)}
        if parallel_tool_calls is not None:
            bound["parallel_tool_calls"] = bool(parallel_tool_calls)
        if strict is not None:
            bound["strict"] = strict
        return self.bind(**bound, **kwargs)

    def with_structured_output(self, schema: Any = None, *, method: str = "json_schema", include_raw: bool = False,
                               strict: bool | None = None, **kwargs: Any) -> Runnable:
        """Output matching `schema` (pydantic 2 or v1 class, TypedDict, JSON schema or OpenAI
        tool). method "json_schema" (default: decoded under the schema's grammar), "json_mode"
        (any JSON object) or "function_calling" (a forced call of the schema as a tool); strict
        as in `structured.py`."""
        if kwargs:
            raise ConfigError(f"with_structured_output got unsupported arguments {sorted(kwargs)}")
        return structured_output(self, schema, method, include_raw, strict)

    def _get_ls_params(self, stop: list[str] | None = None, **kwargs: Any) -> Any:
        params = super()._get_ls_params(stop=stop, **kwargs)
        params["ls_provider"] = "agentrt"
        if stop is None and self.stop:
            params["ls_stop"] = self.stop
        return params

    # ---- sessions ------------------------------------------------------------------------
    async def arelease(self, thread_id: str | None = None) -> int:
        """Release the KV sessions of one thread (all threads when None); returns how many."""
        sh = self._local("arelease")
        prefix = "" if thread_id is None else f"{thread_id}/"
        out = [n async for n in sh.host.astream(lambda: _one(sh.router.release_prefix(prefix)))]
        return out[0]

    async def afork(self, src_thread_id: str, dst_thread_id: str) -> int:
        """Branch a conversation: the sessions of thread (or explicit session key) `dst_thread_id`
        become forks of `src_thread_id`'s, their KV pages shared copy-on-write, so a branched
        thread (LangGraph time travel, a what-if run) prefills only its new messages. The
        destination's own sessions are released first. Returns how many sessions were forked."""
        for name, value in (("src_thread_id", src_thread_id), ("dst_thread_id", dst_thread_id)):
            if not isinstance(value, str) or not value:
                raise ConfigError(f"{name} must be a non-empty str, got {value!r}")
        if src_thread_id == dst_thread_id:
            raise ConfigError("src_thread_id and dst_thread_id must differ")
        sh = self._local("afork")
        router = sh.router
        out = [n async for n in sh.host.astream(lambda: _one(router.fork(src_thread_id, dst_thread_id)))]
        return out[0]

    def _local(self, what: str) -> _Shared:
        """The in-process engine's shared state (ConfigError for a remote ChatAgentrt)."""
        if self._shared is None:
            raise ConfigError(f"{what} needs an in-process engine; a remote agentrt serve releases idle sessions "
                              "by its --session-ttl")
        return self._shared

    def _server(self) -> RemoteServer:
        """The remote agentrt serve (a ChatAgentrt without an in-process engine has one)."""
        if self._remote is None:
            raise ConfigError("this ChatAgentrt has neither an engine nor a base_url")
        return self._remote

    def close(self) -> None:
        """Release every session; stop the engine if from_model started it."""
        sh = self._shared
        if sh is None:
            return
        if sh.host.owns_engine:
            list(sh.host.stream(lambda: _one(sh.router.release_prefix(""))))
            sh.host.close()

    @property
    def sessions(self) -> dict[str, Any]:
        """Routed session keys -> their RoutedSession (read-only view, for inspection; empty for a
        remote ChatAgentrt, whose sessions the server holds)."""
        return {} if self._shared is None else dict(self._shared.router.sessions)


def _profile(engine: EngineLike, max_tokens: int) -> ModelProfile:
    """The LangChain model profile (what create_agent and its middleware read: context size for
    SummarizationMiddleware's fractional triggers; structured output is left to ToolStrategy,
    which keeps tools callable, instead of a JSON-only grammar)."""
    context = min(engine.model.cfg.max_position_embeddings, engine.config.kv_cache_tokens)
    return ModelProfile(max_input_tokens=context, max_output_tokens=max_tokens, text_inputs=True,
                        image_inputs=False, audio_inputs=False, video_inputs=False, tool_calling=True,
                        tool_choice=True, structured_output=False)


async def _one(coro) -> AsyncIterator[Any]:
    yield await coro


def _errors(e: ValidationError) -> str:
    """A pydantic ValidationError as one line: `field: what was wrong (got value)` per error."""
    return "; ".join(f"{'.'.join(map(str, err['loc'])) or 'arguments'}: {err['msg']} (got {err.get('input')!r})"
                     for err in e.errors())
