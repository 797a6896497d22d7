"""OpenAI's wire protocol: `/v1/chat/completions` (chat.py), `/v1/completions` (completions.py)."""
