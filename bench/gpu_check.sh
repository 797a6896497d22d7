#!/usr/bin/env bash
# The engine on a GPU, in one JSON (bench/gpu_check.py), on a host that reaches no package index.
# Made beforehand on a connected machine: `python -m bench.gpu_pack` writes .gpu/ (the wheels the
# CUDA image lacks, the embedded tokenizer and the SmolLM2 config; ~11 MB), sent with the checkout.
# The host's own torch (a CUDA build), triton and transformers are used; nothing is built.
#   bash bench/gpu_check.sh [--parts kernels,llama1b,llama8b_q4k,llama8b,agents,faults]
set -euo pipefail
cd "$(dirname "$0")/.."
SITE="${AGENTRT_GPU_SITE:-/tmp/agentrt-site}"
if [ -d .gpu/wheels ] && [ ! -f "$SITE/.done" ]; then
  python3 -m pip install --quiet --no-index --no-deps --target "$SITE" .gpu/wheels/*.whl && touch "$SITE/.done"
fi
# the checkout itself is the package (agentrt/kernels and agentrt/integrations link to the
# top-level folders); the compiled CPU kernels are not built on a GPU host
for pkg in kernels integrations; do  # (a copy that dropped the links gets them back)
  [ -e "agentrt/$pkg" ] || ln -s "../$pkg" "agentrt/$pkg"
done
export PYTHONPATH="$PWD:$SITE${PYTHONPATH:+:$PYTHONPATH}" AGENTRT_NATIVE=0
python3 -m bench.gpu_check --pack .gpu/pack "$@"
