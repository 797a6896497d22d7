"""The `agentrt` command line, run as a newcomer would (the installed console script)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

pytestmark = [pytest.mark.embedded, pytest.mark.slow]


def _exe() -> str:
    """The console script next to this interpreter (make test does not put .venv/bin on PATH)."""
    here = Path(sys.executable).parent / "agentrt"
    return str(here) if here.exists() else shutil.which("agentrt")


def _agentrt(*args: str, stdin: str | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([_exe(), *args], input=stdin, capture_output=True, text=True, timeout=timeout)


def test_help_lists_every_command():
    out = _agentrt("--help")
    assert out.returncode == 0
    for cmd in ("serve", "chat", "demo", "bench", "info"):
        assert cmd in out.stdout
    assert "--api-key" in _agentrt("serve", "--help").stdout


def test_info_describes_the_embedded_model():
    out = _agentrt("info")
    assert out.returncode == 0, out.stderr
    for key in ("architecture", "weights", "context", "kv cache dtype", "chat/tool format", "kernels", "machine"):
        assert key in out.stdout
    assert "Q4_1" in out.stdout and "hermes" in out.stdout


def test_a_missing_model_is_a_clear_error():
    out = _agentrt("info", "/no/such/model.gguf")
    assert out.returncode == 2 and "ModelNotFound" in out.stderr and "Traceback" not in out.stderr
    out = _agentrt("bench", "nonexistent")
    assert out.returncode == 2 and "no benchmark named 'nonexistent'" in out.stderr


@pytest.fixture(scope="module")
def chats() -> tuple[subprocess.CompletedProcess, subprocess.CompletedProcess]:
    """`agentrt chat` with a required tool call, and without tools."""
    return (_agentrt("chat", "--tool-choice", "required", stdin="What is 12 times 34?\n"),
            _agentrt("chat", "--no-tools", stdin="Hi! What is the capital of France?\n"))


def test_chat_shows_the_tool_call_and_its_result(chats):
    """A call is shown with its arguments and the tool's result on them; a reply with its KV reuse."""
    import ast
    import re

    from agentrt.cli.terminal_chat import calculate

    calc, plain = chats
    assert calc.returncode == 0 and plain.returncode == 0, calc.stderr + plain.stderr
    shown = re.search(r"\[call (\w+)\((.*)\)\]\s*\[-> (.+)\]", calc.stdout)
    assert shown and shown[1] in ("calculate", "current_time"), calc.stdout  # (required: one of the tools)
    args = {k.arg: ast.literal_eval(k.value) for k in ast.parse(f"f({shown[2]})").body[0].value.keywords}
    assert shown[3] == calculate(**args) if shown[1] == "calculate" else not args
    assert "from KV already held" in plain.stdout


@pytest.mark.model_quality
def test_chat_answers_right(chats):
    """The 135M model's call and answer (the CLI around them: the test above)."""
    calc, plain = chats
    assert "[call calculate(a=12, op='times', b=34)]" in calc.stdout and "[-> 408]" in calc.stdout
    assert "Paris" in plain.stdout


def test_serve_answers_on_loopback_and_stops():
    proc = subprocess.Popen([_exe(), "serve", "--port", "18731", "--log-level", "warning"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                if httpx.get("http://127.0.0.1:18731/health").json()["status"] == "ok":
                    break
            except httpx.TransportError:
                pass
            assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read() if proc.poll() else "timeout"
            time.sleep(0.2)
        r = httpx.post("http://127.0.0.1:18731/v1/chat/completions", timeout=60, json={
            "messages": [{"role": "user", "content": "Hi! What is the capital of France?"}], "temperature": 0,
            "max_tokens": 16})
        assert r.json()["choices"][0]["message"]["content"]  # (its quality: test_chat_answers_right)
        assert r.json()["model"] == "smollm2-135m"
    finally:
        proc.terminate()
        assert proc.wait(timeout=30) is not None


def test_a_wrong_bench_name_lists_the_valid_ones():
    r = _agentrt("bench", "modle")
    assert r.returncode != 0 and "no benchmark named 'modle'" in r.stderr
    assert "model" in r.stderr and "server" in r.stderr
