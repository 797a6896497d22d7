"""bench/'s layout, read from its files (nothing is run): the runnable scripts (a `__main__`
block) are the commands bench/README.md and the Makefile's BENCH_SCRIPTS list, and no two bench
modules import each other, directly or around a circle, function-level imports included."""

from __future__ import annotations

import re
from pathlib import Path

from tests.test_structure import circles, imports

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "bench"


def bench_modules() -> dict[str, Path]:
    """Import name -> file, for every module under bench/ (results/ holds no code)."""
    out = {}
    for path in sorted(BENCH.rglob("*.py")):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def runnable() -> set[str]:
    return {name for name, path in bench_modules().items() if '__name__ == "__main__"' in path.read_text()}


def readme_commands() -> set[str]:
    return set(re.findall(r"python -m (bench(?:\.\w+)+)", (BENCH / "README.md").read_text()))


def makefile_scripts() -> set[str]:
    text = (ROOT / "Makefile").read_text().replace("\\\n", " ")
    m = re.search(r"^BENCH_SCRIPTS\s*:=(.*)$", text, re.M)
    assert m, "the Makefile lists bench's scripts in BENCH_SCRIPTS"
    return set(m.group(1).split())


def test_readme_and_makefile_list_every_runnable_script():
    scripts = runnable()
    assert makefile_scripts() == scripts, (makefile_scripts() ^ scripts)
    assert readme_commands() == scripts, (readme_commands() ^ scripts)


def test_no_import_circles_in_bench_function_level_imports_included():
    known = bench_modules()
    graph = {name: imports(name, path, known) for name, path in known.items()}
    found = circles(graph)
    assert not found, "bench modules importing each other:\n" + "\n".join(" <-> ".join(c) for c in found)


# the scripts copied alone onto the bare GPU machine (bench/gpu_pack.py) find the root themselves
STANDALONE = {"bench.gpu_pack", "bench.gpu_check", "bench.gpu_faults"}


def test_the_repository_root_is_found_in_one_place():
    """A module moved into a sub-package once kept `parents[1]` and read bench/docs/ for docs/:
    every bench module takes ROOT or RESULTS from bench.common instead of counting parents."""
    counting = {name for name, path in bench_modules().items()
                if re.search(r"__file__\)\.resolve\(\)\.parents\[", path.read_text())}
    assert counting - STANDALONE == {"bench.common"}, counting - STANDALONE
