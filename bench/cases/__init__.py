"""Cases the benchmark scripts of bench/ run: each module builds one comparison's workload, runs
it and returns its JSON keys (bench_model.py: moe, swa, context, invariance; bench_agents.py:
agents, memory, fast-forward, tracing, pipelined tools, snapshot). Some also run alone:
`python -m bench.cases.<name> --quick`. random_gguf.py writes the random-weight GGUF files the
model cases load."""
