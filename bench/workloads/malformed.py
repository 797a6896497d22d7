"""Malformed request bodies for `agentrt serve`, as a hostile or careless client sends them: each
with the status it must get (a 4xx, never a 500) and the field its error must name (`param`).

Used by tests/test_server_security.py (every probe, then a live server) and by bench/soak.py's
corpus pass, whose counts go to bench/results/reliability.json.
"""

from __future__ import annotations

U = [{"role": "user", "content": "What is the weather in Paris?"}]


def _chat(name: str, body, param: str | None = None, status: int = 400) -> dict:
    return {"name": name, "path": "/chat/completions", "body": body, "param": param, "status": status}


def _raw(name: str, data: bytes, path: str = "/chat/completions", status: int = 400) -> dict:
    return {"name": name, "path": path, "raw": data, "param": None, "status": status}


def _comp(name: str, body, param: str | None = None, status: int = 400) -> dict:
    return {"name": name, "path": "/completions", "body": body, "param": param, "status": status}


def fn(name: str, params=None) -> dict:
    return {"type": "function", "function": {"name": name, **({"parameters": params} if params is not None else {})}}


PROBES: list[dict] = [
    _raw("not JSON", b"{not json"),
    _raw("truncated JSON", b'{"messages": [{"role": "user", "content": "hi"'),
    _raw("JSON nested 100k deep", b"[" * 100_000 + b"]" * 100_000),
    _raw("NaN temperature", b'{"messages": [{"role": "user", "content": "hi"}], "temperature": NaN}'),
    _raw("Infinity max_tokens", b'{"messages": [{"role": "user", "content": "hi"}], "max_tokens": Infinity}'),
    _raw("invalid UTF-8", b'{"messages": [{"role": "user", "content": "\xff\xfe"}]}'),
    _chat("body is an array", [1, 2]),
    _chat("body is a string", "hello"),
    _chat("messages missing", {"model": "m"}, "messages"),
    _chat("messages a string", {"messages": "hi"}, "messages"),
    _chat("messages empty", {"messages": []}, "messages"),
    _chat("message a number", {"messages": [5]}, "messages.0"),
    _chat("unknown role", {"messages": [{"role": "robot", "content": "hi"}]}, "messages.0.role"),
    _chat("role missing", {"messages": [{"content": "hi"}]}, "messages.0.role"),
    _chat("content a number", {"messages": [{"role": "user", "content": 5}]}, "messages.0.content"),
    _chat("content an image part", {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]}, "messages.0.content.0.type"),
    _chat("text part without text", {"messages": [{"role": "user", "content": [{"type": "text"}]}]}, "messages.0.content.0.text"),
    _chat("tool_calls a number", {"messages": [*U, {"role": "assistant", "content": None, "tool_calls": 5}]}, "messages.1.tool_calls"),
    _chat("tool call without id", {"messages": [*U, {"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": "{}"}}]}]}, "messages.1.tool_calls.0.id"),
    _chat("tool call id a number", {"messages": [*U, {"role": "assistant", "tool_calls": [{"id": 1, "function": {"name": "f"}}]}]}, "messages.1.tool_calls.0.id"),
    _chat("tool call arguments not JSON", {"messages": [*U, {"role": "assistant", "tool_calls": [{"id": "c", "function": {"name": "f", "arguments": "{bad"}}]}]}, "messages.1"),
    _chat("tool call arguments a number", {"messages": [*U, {"role": "assistant", "tool_calls": [{"id": "c", "function": {"name": "f", "arguments": 5}}]}]}, "messages.1.tool_calls.0.function.arguments"),
    _chat("tool_calls on a user message", {"messages": [{"role": "user", "content": "x", "tool_calls": [{"id": "c", "function": {"name": "f"}}]}]}, "messages.0"),
    _chat("tool message without tool_call_id", {"messages": [*U, {"role": "tool", "content": "18C"}]}, "messages.1"),
    _chat("tools an object", {"messages": U, "tools": {"f": 1}}, "tools"),
    _chat("tool of another type", {"messages": U, "tools": [{"type": "retrieval"}]}, "tools.0.type"),
    _chat("tool without function", {"messages": U, "tools": [{"type": "function"}]}, "tools.0.function"),
    _chat("tool name with spaces", {"messages": U, "tools": [fn("get weather!")]}, "tools.0.function.name"),
    _chat("tool parameters a list", {"messages": U, "tools": [fn("f", [1])]}, "tools.0.function.parameters"),
    _chat("tool parameters not a JSON schema", {"messages": U, "tools": [fn("f", {"type": "strin"})]}, "tools.0.function.parameters"),
    _chat("tool parameters with a bad regex", {"messages": U, "tools": [fn("f", {"type": "string", "pattern": "(["})]},
          "tools.0.function.parameters"),
    _chat("tool parameters with a dangling $ref", {"messages": U, "tools": [fn("f", {"$ref": "#/nowhere"})], "tool_choice": "required"}, "tools.0.function.parameters"),
    _chat("second tool with a lookbehind", {"messages": U, "tools": [fn("ok", {"type": "object"}), fn("g", {"type": "object", "properties": {"a": {"type": "string", "pattern": "(?<=a)b"}}})], "tool_choice": "required"}, "tools.1.function.parameters"),
    _chat("two tools with one name", {"messages": U, "tools": [fn("f"), fn("f")]}, "tools.1.function.name"),
    _chat("tool_choice names no tool", {"messages": U, "tools": [fn("f")], "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
    _chat("tool_choice a number", {"messages": U, "tools": [fn("f")], "tool_choice": 7}, "tool_choice"),
    _chat("tool_choice unknown word", {"messages": U, "tools": [fn("f")], "tool_choice": "always"}, "tool_choice"),
    _chat("tool_choice required without tools", {"messages": U, "tool_choice": "required"}, "tool_choice"),
    _chat("response_format of unknown type", {"messages": U, "response_format": {"type": "xml"}}, "response_format.type"),
    _chat("json_schema format without schema", {"messages": U, "response_format": {"type": "json_schema"}}, "response_format"),
    _chat("response schema not a JSON schema", {"messages": U, "response_format": {"type": "json_schema", "json_schema": {"name": "r", "schema": {"type": 5}}}}, "response_format.json_schema.schema"),
    _chat("response schema the grammar cannot compile", {"messages": U, "response_format": {"type": "json_schema", "json_schema": {"name": "r", "schema": {"type": "object", "properties": {"a": {"type": "string", "pattern": "(?<=a)b"}}}}}}, "response_format.json_schema.schema"),
    _chat("max_tokens negative", {"messages": U, "max_tokens": -1}, "max_tokens"),
    _chat("max_tokens a word", {"messages": U, "max_tokens": "ten"}, "max_tokens"),
    _chat("max_tokens over the limit", {"messages": U, "max_tokens": 100000}, "max_tokens"),
    _chat("temperature a word", {"messages": U, "temperature": "hot"}, "temperature"),
    _chat("temperature 5", {"messages": U, "temperature": 5}, "temperature"),
    _chat("top_p 0", {"messages": U, "top_p": 0}, "top_p"),
    _chat("seed 2**70", {"messages": U, "seed": 2 ** 70}, "seed"),
    _chat("empty stop string", {"messages": U, "stop": ["", "x"]}, "stop"),
    _chat("five stop strings", {"messages": U, "stop": list("abcde")}, "stop"),
    _chat("n 3", {"messages": U, "n": 3}, "n"),
    _chat("stream a word", {"messages": U, "stream": "maybe"}, "stream"),
    _chat("stream_options a number", {"messages": U, "stream_options": 5}, "stream_options"),
    _chat("logprobs", {"messages": U, "logprobs": True}, "logprobs"),
    _chat("logit_bias", {"messages": U, "logit_bias": {"5": 10}}, "logit_bias"),
    _chat("empty prompt_cache_key", {"messages": U, "prompt_cache_key": ""}, "prompt_cache_key"),
    _chat("empty cache_salt", {"messages": U, "cache_salt": ""}, "cache_salt"),
    _chat("content 4 MB", {"messages": [{"role": "user", "content": "x" * (4 << 20)}]}, None, 413),
    _comp("prompt missing", {"max_tokens": 4}, "prompt"),
    _comp("prompt an object", {"prompt": {"a": 1}}, "prompt"),
    _comp("prompt ids negative", {"prompt": [-1, 5]}, "prompt"),
    _comp("prompt id past the vocabulary", {"prompt": [10 ** 12]}, "prompt"),
    _comp("prompt empty", {"prompt": ""}, "prompt"),
    _comp("echo", {"prompt": "hi", "echo": True}, "prompt"),
    _comp("best_of 2", {"prompt": "hi", "best_of": 2}, "prompt"),
    _raw("completion body not JSON", b"}{", "/completions"),
]
