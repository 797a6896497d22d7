#!/usr/bin/env bash
# GPU readiness in one JSON (bench/gpu_check.py): triton kernel tests natively, the embedded
# model's decode steps on the device, a 4-agent tool-calling turn loop. About 5 minutes on one GPU.
# The project's venv is made as `make test` makes it (CPU torch pin: on a GPU machine, install
# the CUDA build of the same torch version into .venv first).
set -euo pipefail
cd "$(dirname "$0")/.."
make -s venv >/dev/null
timeout 300 .venv/bin/python -m bench.gpu_check --device "${1:-cuda}"
