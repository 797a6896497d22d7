"""agentrt's OpenAI-compatible HTTP server (`agentrt serve`): `/v1/chat/completions` with tools,
streaming and per-conversation KV sessions (`prompt_cache_key`), `/v1/completions`,
`/v1/models`, `/health`, `/metrics`; OpenAI's `/v1/responses` and Anthropic's `/v1/messages`.
One folder per wire protocol (`openai/`, `responses/`, `anthropic/`), each a thin client of the
shared round runner (round_runner.py). Needs the `server` extra (FastAPI, uvicorn)."""

from .app import build_app
from .config import ServerConfig
from .openai import chat  # noqa: F401 - (bench/bench_server.py's in-process sender: chat.prepare / run / response)
from .protocol import ApiError
from .serving import ServerThread, serve

__all__ = ["ApiError", "ServerConfig", "ServerThread", "build_app", "serve"]
