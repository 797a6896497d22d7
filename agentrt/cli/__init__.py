"""The `agentrt` command line.

    agentrt serve [MODEL]      an OpenAI-compatible server (127.0.0.1:8000 by default)
    agentrt chat [MODEL]       chat in the terminal; tool calls are shown as they run
    agentrt demo               the multi-agent tool-calling demo (= make demo)
    agentrt dashboard [MODEL]  a multi-agent workload on an in-process engine, with the live dashboard
    agentrt bench NAME         a benchmark of bench/ (e.g. `agentrt bench model --quick`)
    agentrt info [MODEL]       architecture, quantization, context, formats, kernels, machine

MODEL: an embedded model name (default: smollm2-135m), a .gguf file or a Hugging Face directory.
"""

from __future__ import annotations

import argparse
import os
import runpy
import subprocess
import sys
from pathlib import Path
from typing import Any

from agentrt.errors import AgentrtError

ROOT = Path(__file__).resolve().parents[2]


def _model_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", nargs="?", default="smollm2-135m",
                   help="embedded model name, hf://<org>/<repo>[/<file.gguf>], .gguf file or Hugging Face "
                        "directory (default: smollm2-135m)")
    p.add_argument("--quantize", default="auto", choices=("auto", "none", "native", "int8"),
                   help="weights: the checkpoint's own form (auto), fp32 (none), or int8")
    p.add_argument("--kv-cache-tokens", type=int, default=None, help="KV cache size in tokens (engine default)")


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="agentrt", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="command", metavar="COMMAND", required=True)
    s = sub.add_parser("serve", help="run the OpenAI-compatible server")
    _model_arg(s)
    s.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)")
    s.add_argument("--port", type=int, default=8000)
    s.add_argument("--api-key", action="append", default=None,
                   help="accepted bearer token (repeatable; default: $AGENTRT_API_KEY; none: no authentication)")
    s.add_argument("--served-model-name", default=None, help="the model id clients see (default: MODEL)")
    s.add_argument("--adapter", action="append", default=[], metavar="NAME=PATH",
                   help="a LoRA adapter (a PEFT directory or a llama.cpp .gguf LoRA file) served as model NAME (repeatable)")
    s.add_argument("--any-model", action="store_true",
                   help="answer requests whatever `model` they name (default: another name is a 404)")
    s.add_argument("--max-tokens-limit", type=int, default=4096, help="largest max_tokens a request may ask")
    s.add_argument("--max-request-bytes", type=int, default=4 << 20, help="largest request body")
    s.add_argument("--max-concurrency-per-key", type=int, default=64, help="requests in flight per API key")
    s.add_argument("--max-sessions", type=int, default=256, help="conversation sessions kept (LRU beyond)")
    s.add_argument("--session-ttl", type=float, default=900.0, help="seconds an idle conversation keeps its KV")
    s.add_argument("--max-stored-responses", type=int, default=4096,
                   help="Responses API: stored responses kept (oldest dropped beyond)")
    s.add_argument("--response-ttl", type=float, default=3600.0, help="Responses API: seconds a stored response is kept")
    s.add_argument("--state-dir", default=None, metavar="DIR",
                   help="keep state across restarts: stored responses, sessions and their KV (SQLite and KV "
                        "records in DIR); a restarted server continues every previous_response_id chain")
    s.add_argument("--state-url", default=None, metavar="URL",
                   help="keep the state store in PostgreSQL (postgresql://...; pip install -e .[postgres]), "
                        "shared by several servers; KV records stay in --state-dir when given")
    s.add_argument("--disk-kv-bytes", type=int, default=None, help="bytes of KV records kept in --state-dir")
    s.add_argument("--replicas", type=int, default=1,
                   help="engine replicas on Ray (pip install -e .[ray]); conversations stay on one replica")
    s.add_argument("--threads-per-replica", type=int, default=1, help="torch threads of each replica")
    s.add_argument("--log-level", default="info", choices=("critical", "error", "warning", "info", "debug"))
    s.add_argument("--dashboard", action="store_true", help="serve the live dashboard page at /dashboard/")
    s.add_argument("--trace", action="store_true",
                   help="OpenTelemetry traces into the global TracerProvider (configure one, e.g. run under "
                        "opentelemetry-instrument with OTEL_* variables); needs pip install -e .[otel]")
    c = sub.add_parser("chat", help="chat in the terminal")
    _model_arg(c)
    c.add_argument("--system", default=None, help="a system message (default: the chat template's own)")
    c.add_argument("--no-tools", action="store_true", help="offer no tools (default: a calculator and a clock)")
    c.add_argument("--max-tokens", type=int, default=256)
    c.add_argument("--tool-choice", default="auto", choices=("auto", "required"),
                   help="required: every message starts with a tool call (the 135M model seldom calls one itself)")
    sub.add_parser("demo", help="the multi-agent tool-calling demo on the embedded model")
    d = sub.add_parser("dashboard", help="agents working on an in-process engine, watched on the live dashboard")
    _model_arg(d)
    d.add_argument("--host", default="127.0.0.1", help="address of the dashboard (default: this machine only)")
    d.add_argument("--port", type=int, default=8265, help="dashboard port (0: any free one)")
    d.add_argument("--agents", type=int, default=3, help="agents in the pipeline (default 3)")
    d.add_argument("--tasks", type=int, default=0, help="tasks to run, then keep serving (default 0: until Ctrl-C)")
    b = sub.add_parser("bench", help="run a benchmark of bench/ (arguments after NAME go to it)")
    b.add_argument("name", help="e.g. model, sessions, agents, server (bench/bench_NAME.py)")
    b.add_argument("args", nargs=argparse.REMAINDER, help="e.g. --quick")
    p = sub.add_parser("pull", help="download a model from the Hugging Face Hub into its cache (and check it)")
    p.add_argument("name", help="hf://<org>/<repo>[@<revision>][/<file.gguf>]")
    i = sub.add_parser("info", help="describe a model and this machine")
    _model_arg(i)
    i.add_argument("--bandwidth", action="store_true", help="also measure memory read bandwidth (a few seconds)")
    return ap


def _load(args):
    from agentrt.model.loaders.load import load_model

    return load_model(args.model, quantize=args.quantize)


def _engine_config(args: argparse.Namespace, durable: bool = False):
    """The EngineConfig the options ask for (None: the engine's defaults); `durable`: the
    command has serve's --state-dir, --state-url and --disk-kv-bytes."""
    from agentrt.config import EngineConfig

    kw: dict[str, Any] = {"kv_cache_tokens": args.kv_cache_tokens} if args.kv_cache_tokens else {}
    if durable:
        kw.update({name: value for name, value in (("state_dir", args.state_dir), ("state_url", args.state_url))
                   if value})
        if args.disk_kv_bytes is not None:
            kw["disk_budget_bytes"] = args.disk_kv_bytes
    return EngineConfig(**kw) if kw else None


def _adapter_args(values: list[str]) -> tuple[tuple[str, str], ...]:
    pairs = [v.split("=", 1) for v in values]
    bad = [v for v, p in zip(values, pairs) if len(p) != 2 or not all(p)]
    if bad:
        raise SystemExit(f"agentrt serve: --adapter takes NAME=PATH (a PEFT adapter directory or a .gguf LoRA file), got {bad[0]!r}")
    return tuple((name, path) for name, path in pairs)


def cmd_serve(args) -> None:
    from agentrt.server import ServerConfig, serve

    keys = tuple(args.api_key or ([os.environ["AGENTRT_API_KEY"]] if os.environ.get("AGENTRT_API_KEY") else []))
    config = ServerConfig(host=args.host, port=args.port, api_keys=keys,
                          model_name=args.served_model_name or str(args.model),
                          max_request_bytes=args.max_request_bytes, max_tokens_limit=args.max_tokens_limit,
                          max_concurrency_per_key=args.max_concurrency_per_key, max_sessions=args.max_sessions,
                          max_stored_responses=args.max_stored_responses, response_ttl_s=args.response_ttl,
                          session_ttl_s=args.session_ttl, replicas=args.replicas,
                          threads_per_replica=args.threads_per_replica, dashboard=args.dashboard,
                          any_model=args.any_model, adapters=_adapter_args(args.adapter))
    if args.trace:
        from agentrt import tracing

        tracing.enable()
    if config.public and not keys:
        print(f"warning: listening on {args.host} without an API key: anyone who can reach this port can use "
              "the model (set --api-key or AGENTRT_API_KEY)", file=sys.stderr)
    if args.replicas > 1:  # each Ray replica loads the model in its own process
        from agentrt.integrations.ray import ModelSpec

        model = ModelSpec(str(args.model), load_kwargs={"quantize": args.quantize})
    else:
        model = _load(args)
    where = f" on {args.replicas} replicas" if args.replicas > 1 else ""
    print(f"agentrt: serving {config.model_name}{where} on http://{args.host}:{args.port}/v1", file=sys.stderr)
    if args.dashboard:
        print(f"agentrt: dashboard on http://{args.host}:{args.port}/dashboard/", file=sys.stderr)
    serve(model, config, _engine_config(args, durable=True), log_level=args.log_level)


def _script(kind: str, name: str) -> Path:
    path = ROOT / kind / name
    if not path.is_file() and (ROOT / kind).is_dir() and kind == "bench":
        names = sorted(p.stem.removeprefix("bench_") for p in (ROOT / kind).glob("bench_*.py"))
        raise AgentrtError(f"no benchmark named {name.removeprefix('bench_').removesuffix('.py')!r}; "
                           f"`agentrt bench NAME` takes one of: {', '.join(names)}")
    if not path.is_file():
        raise AgentrtError(f"{kind}/{name} is not here: `agentrt {kind.rstrip('s')}` runs from a source checkout "
                           "of agentrt (git clone, then `make test` or `pip install -e .`)")
    return path


def cmd_demo(args) -> None:
    path = _script("examples", "multi_agent_tools.py")
    sys.argv = [str(path)]
    runpy.run_path(str(path), run_name="__main__")


def cmd_bench(args) -> None:
    _script("bench", f"bench_{args.name}.py")
    # bench/ is a folder of the checkout, not an installed package: run it as `python -m bench.x`
    # from the root (its folders have no __init__.py, so no installed distribution is shadowed)
    cmd = [sys.executable, "-m", f"bench.bench_{args.name}", *args.args]
    raise SystemExit(subprocess.run(cmd, cwd=ROOT).returncode)


def cmd_chat(args) -> None:
    import anyio

    from agentrt.cli.terminal_chat import chat

    anyio.run(chat, _load(args), _engine_config(args), args)


def cmd_dashboard(args) -> None:
    import anyio

    from agentrt.cli.dashboard import check_args, run

    check_args(args)  # (before loading the model)
    anyio.run(run, _load(args), _engine_config(args), args)


def cmd_info(args) -> None:
    from agentrt.cli.info import describe

    for key, value in describe(_load(args), bandwidth=args.bandwidth):
        print(f"{key:<22} {value}")


def cmd_pull(args) -> None:
    from agentrt.model.loaders.hub import resolve

    print(resolve(args.name, download=True))


COMMANDS = {"serve": cmd_serve, "chat": cmd_chat, "demo": cmd_demo, "bench": cmd_bench, "info": cmd_info,
            "pull": cmd_pull, "dashboard": cmd_dashboard}


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        COMMANDS[args.command](args)
    except AgentrtError as e:
        print(f"agentrt {args.command}: {type(e).__name__}: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
