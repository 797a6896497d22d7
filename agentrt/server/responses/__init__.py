"""OpenAI's Responses API: `/v1/responses` (models.py, run.py, routes.py)."""
