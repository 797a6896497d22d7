"""Constrained decoding: the per-request constraint the engine's step calls (`constraint.py`),
the tool-call and JSON-schema grammars over xgrammar / llguidance (`grammar.py`,
`grammar_backends.py`, `grammar_llg.py`, `schema_errors.py`), token masks (`masks.py`) and
fast-forward over forced text (`forcing.py`, `fast_forward.py`).

Used by the engine (it imports no engine module but the shared request records); the sans-I/O
tool-call parser (`agentrt/toolcall/`) sits below it and knows nothing of it."""
