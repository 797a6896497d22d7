"""agentrt's OpenAI-compatible HTTP server (`agentrt serve`): `/v1/chat/completions` with tools,
streaming and per-conversation KV sessions (`prompt_cache_key`), `/v1/completions`,
`/v1/models`, `/health`, `/metrics`. Needs the `server` extra (FastAPI, uvicorn)."""

from .app import build_app
from .config import ServerConfig
from .protocol import ApiError
from .runner import ServerThread, serve

__all__ = ["ApiError", "ServerConfig", "ServerThread", "build_app", "serve"]
