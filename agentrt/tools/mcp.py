"""MCP tools: the tools of a Model Context Protocol server as agentrt tools (`pip install
'agentrt[mcp]'`, the official `mcp` SDK).

    async with MCPTools(command=sys.executable, args=["weather_server.py"]) as mcp:   # stdio
        agent = Agent("weather", "Use the tools.", mcp.tools, tool_choice="required")
        ...
    async with MCPTools(url="http://127.0.0.1:8765/mcp") as mcp:                     # streamable HTTP

Each MCP tool keeps its name, description and input JSON schema (`Tool.from_openai`), so its
calls are constrained by the grammar and validated against the schema like a Python tool's.
A call goes to the server through the session (`call_tool`); its text content is the result.
A result the server marks `isError`, an error the server raises, a timeout and a dead server
are all tool errors the model reads (ToolCallError); the agent goes on.

The connection lives for the `async with` block (one session, shared by every agent that uses
the tools): keep the block around the Runtime that runs them.
"""

from __future__ import annotations

import json
import re
from contextlib import AsyncExitStack
from datetime import timedelta
from typing import Any

import anyio

from agentrt.errors import ConfigError, ToolCallError
from agentrt.tools.tool import Tool

_NAME_OK = re.compile(r"[^A-Za-z0-9_-]")


class MCPTools:
    """One MCP server's tools for the life of an `async with` block: give `command` (and
    `args`, `env`, `cwd`: a stdio server the block starts and stops) or `url` (and `headers`: a
    streamable HTTP server). `timeout`: seconds a call may take (a tool error after it);
    `include`: the tool names to keep (default all)."""

    def __init__(self, *, command: str | None = None, args: list[str] | tuple[str, ...] = (),
                 env: dict[str, str] | None = None, cwd: str | None = None, url: str | None = None,
                 headers: dict[str, str] | None = None, timeout: float = 30.0,
                 include: list[str] | None = None) -> None:
        if (command is None) == (url is None):
            raise ConfigError("MCPTools takes command= (a stdio server) or url= (streamable HTTP), one of them")
        if not isinstance(timeout, (int, float)) or isinstance(timeout, bool) or not timeout > 0:
            raise ConfigError(f"timeout must be a number of seconds > 0, got {timeout!r}")
        self.command, self.args, self.env, self.cwd = command, list(args), env, cwd
        self.url, self.headers, self.timeout, self.include = url, headers, float(timeout), include
        self.tools: list[Tool] = []
        self.session: Any = None  # while connected
        self.error: BaseException | None = None  # what ended the connection early
        self._closed = anyio.Event()
        self._calls: set[anyio.CancelScope] = set()  # calls in flight: cancelled when the server goes away

    async def __aenter__(self) -> "MCPTools":
        mcp = _import()
        self._tg = anyio.create_task_group()
        await self._tg.__aenter__()
        try:
            listed = await self._tg.start(self._serve, mcp)
        except BaseException:
            self._closed.set()
            await self._tg.__aexit__(None, None, None)
            raise
        self.tools = [self._tool(t) for t in listed if self.include is None or t.name in self.include]
        return self

    async def __aexit__(self, *exc) -> None:
        self._closed.set()
        await self._tg.__aexit__(None, None, None)

    async def _serve(self, mcp, *, task_status) -> None:
        """Own the connection in a task of its own: a transport that fails (the server died) ends
        here, never in the caller's task; calls then get tool errors."""
        try:
            async with AsyncExitStack() as stack:
                streams = await stack.enter_async_context(self._transport(mcp))
                session = await stack.enter_async_context(mcp.ClientSession(streams[0], streams[1]))
                with anyio.fail_after(self.timeout):
                    await session.initialize()
                    listed = (await session.list_tools()).tools
                self.session = session
                task_status.started(listed)
                await self._closed.wait()
        except Exception as e:  # noqa: BLE001 - before started(): the caller's error; after: the calls'
            if self.session is None:
                raise ConfigError(f"cannot connect to the MCP server ({self._where()}): {type(e).__name__}: {e}") from e
            self.error = e
        except BaseExceptionGroup as group:  # the transport's task group: the server went away
            if self.session is None:
                raise ConfigError(f"cannot connect to the MCP server ({self._where()}): {group!r}") from group
            self.error = group
        finally:
            self.session = None
            for scope in self._calls:
                scope.cancel()

    def _where(self) -> str:
        return self.url or " ".join([self.command or "", *self.args])

    def _transport(self, mcp):
        if self.url is not None:
            from mcp.client.streamable_http import streamablehttp_client

            return streamablehttp_client(self.url, headers=self.headers)
        from mcp.client.stdio import stdio_client

        return stdio_client(mcp.StdioServerParameters(command=self.command, args=self.args, env=self.env, cwd=self.cwd))

    def _tool(self, t: Any) -> Tool:
        name = _NAME_OK.sub("_", t.name)[:64]

        async def call(**arguments: Any) -> str:
            return await self.call(t.name, arguments)

        spec = {"type": "function", "function": {"name": name, "description": t.description or "",
                                                 "parameters": t.inputSchema or {"type": "object"}}}
        return Tool.from_openai(spec, call)

    async def call(self, name: str, arguments: dict[str, Any]) -> str:
        """Call tool `name` on the server: its text, or ToolCallError (a message for the model)."""
        if self.session is None:
            why = f": {type(self.error).__name__}" if self.error is not None else " (its `async with` block ended)"
            raise ToolCallError(f"the MCP server of tool {name!r} is not connected{why}")
        result = None
        with anyio.CancelScope() as scope:
            self._calls.add(scope)
            try:
                result = await self.session.call_tool(name, arguments,
                                                      read_timeout_seconds=timedelta(seconds=self.timeout))
            except Exception as e:  # noqa: BLE001 - a protocol error, a timeout: the model reads it
                raise ToolCallError(f"the MCP server failed on {name}: {type(e).__name__}: {e}") from None
            finally:
                self._calls.discard(scope)
        if result is None:  # cancelled by _serve: the connection ended mid-call
            raise ToolCallError(f"the MCP server went away during the call of {name} ({type(self.error).__name__})")
        text = _text(result)
        if result.isError:
            raise ToolCallError(text or f"the MCP tool {name} reported an error")
        return text


def _text(result: Any) -> str:
    """The result's text parts joined; structured content (or other parts) as JSON."""
    # third-party MCP SDK objects of unknown version: parts and results vary by type
    parts = [c.text for c in result.content if getattr(c, "type", None) == "text"]
    if parts:
        return "\n".join(parts)
    # (third-party MCP result: structuredContent is newer than some SDKs)
    if getattr(result, "structuredContent", None) is not None:
        return json.dumps(result.structuredContent, ensure_ascii=False)
    return json.dumps([c.model_dump(mode="json") for c in result.content], ensure_ascii=False)


def _import():
    try:
        import mcp
    except ImportError as e:
        raise ConfigError("MCP tools need the mcp SDK: pip install 'agentrt[mcp]'") from e
    return mcp
