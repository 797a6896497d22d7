"""Every Python block of README.md and docs/*.md runs as written, as a newcomer would run it: the
block alone in a fresh interpreter (a file of its own), from a folder where `examples/` and
`bench/` resolve as they do from the repository root, on the embedded model. A block that stops
running fails `make test`.

What a block prints is checked where the answer is the point: an HTML comment on the line before
the fence, `<!-- readme-test: prints="get_weather,Paris" -->`, lists strings its output must
hold. `needs=server` starts `agentrt serve` first (the block talks to it over HTTP; the block's
`127.0.0.1:8000` is pointed at the port the test chose). Fixed ports in a block (`port=8265`)
become 0 (any free port), so the suite never fights another program for one.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import free_port as _free_port

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"(?:<!--\s*readme-test:(?P<opts>[^>]*?)-->\s*\n)?```python\n(?P<code>.*?)```", re.S)
OPTION = re.compile(r'(\w+)=("[^"]*"|\S+)')

pytestmark = [pytest.mark.slow, pytest.mark.embedded]


@dataclass(frozen=True)
class Block:
    doc: str
    line: int
    code: str
    prints: tuple[str, ...] = ()
    needs: str = ""

    @property
    def id(self) -> str:
        return f"{self.doc}:{self.line}"


def blocks() -> list[Block]:
    out = []
    for doc in DOCS:
        text = doc.read_text(encoding="utf-8")
        for m in FENCE.finditer(text):
            opts = {k: v.strip('"') for k, v in OPTION.findall(m.group("opts") or "")}
            unknown = set(opts) - {"prints", "needs"}
            assert not unknown, f"{doc.name}: unknown readme-test options {sorted(unknown)}"
            prints = tuple(s.strip() for s in opts.get("prints", "").split(",") if s.strip())
            line = text.count("\n", 0, m.start("code"))
            out.append(Block(doc.name, line, m.group("code"), prints, opts.get("needs", "")))
    return out


BLOCKS = blocks()


def test_the_readme_has_python_blocks():
    """The parser finds the README's blocks (a fence it stops matching would skip them all)."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len([b for b in BLOCKS if b.doc == "README.md"]) == text.count("```python\n") >= 5


def _agentrt() -> list[str]:
    script = Path(sys.executable).with_name("agentrt")
    return [str(script)] if script.exists() else [sys.executable, "-m", "agentrt.cli"]


@pytest.fixture(scope="module")
def server(embedded):
    """`agentrt serve` on the embedded model, as the README starts it (on a free port)."""
    port = _free_port()
    log = open(Path(os.environ.get("TMPDIR", "/tmp")) / f"agentrt-readme-serve-{port}.log", "w+")
    proc = subprocess.Popen([*_agentrt(), "serve", "--port", str(port)], stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 180
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2):
                    break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    log.seek(0)
                    pytest.fail(f"agentrt serve did not start:\n{log.read()[-3000:]}")
                time.sleep(0.3)
        yield port
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


@pytest.mark.parametrize("block", BLOCKS, ids=[b.id for b in BLOCKS])
def test_block_runs(block: Block, tmp_path, request):
    code = re.sub(r"\bport=8265\b", "port=0", block.code)
    if block.needs:
        assert block.needs == "server", f"{block.id}: unknown needs={block.needs!r}"
        port = request.getfixturevalue("server")
        code = code.replace("127.0.0.1:8000", f"127.0.0.1:{port}")
    else:
        request.getfixturevalue("embedded")  # (skips, with its reason, where the model is missing)
    for name in ("examples", "bench"):  # paths the README gives "from the repository root"
        (tmp_path / name).symlink_to(ROOT / name)
    script = tmp_path / "snippet.py"
    script.write_text(code, encoding="utf-8")
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=600)
    shown = f"$ {shlex.join([sys.executable, 'snippet.py'])}\n{code}\n--- stdout\n{done.stdout[-4000:]}" \
            f"\n--- stderr\n{done.stderr[-4000:]}"
    assert done.returncode == 0, f"{block.id} failed to run:\n{shown}"
    missing = [s for s in block.prints if s not in done.stdout]
    assert not missing, f"{block.id} ran but did not print {missing}:\n{shown}"
