"""The wheel installs every import name under `agentrt` (no top-level `kernels` module)."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_wheel_installs_in_fresh_venv(tmp_path):
    dist = tmp_path / "dist"
    subprocess.run([sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir",
                    str(dist), str(ROOT)], check=True, capture_output=True)
    wheel = next(dist.glob("agentrt-*.whl"))
    tops = {n.split("/")[0] for n in zipfile.ZipFile(wheel).namelist()}
    assert "kernels" not in tops and "integrations" not in tops and "agentrt" in tops
    names = set(zipfile.ZipFile(wheel).namelist())
    missing = [p.relative_to(ROOT).as_posix() for p in sorted((ROOT / "agentrt").rglob("*.py"))
               if "__pycache__" not in p.parts and p.relative_to(ROOT).as_posix() not in names]
    assert not missing, f"modules left out of the wheel (list their packages in pyproject.toml): {missing}"
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    py = venv / "bin" / "python"
    # the dependencies (torch, ...) come from this environment through a .pth line placed
    # after the fresh venv's own site-packages, so the installed wheel is what gets imported
    import sysconfig

    site = Path(subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               check=True, capture_output=True, text=True).stdout.strip())
    (site / "zz_deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    subprocess.run([str(py), "-m", "pip", "install", "--no-deps", "--quiet", str(wheel)], check=True)
    code = ("import agentrt, agentrt.kernels, agentrt.integrations.langgraph, agentrt.errors;"
            "import importlib.util as u; assert u.find_spec('kernels') is None or "
            "'agentrt' not in (u.find_spec('kernels').origin or '');"
            "print(agentrt.__file__)")
    out = subprocess.run([str(py), "-c", code], check=True, capture_output=True, text=True,
                         cwd=tmp_path).stdout
    assert str(venv) in out


# the checkout's folders that are not packages of their own: each has a top-level name that
# another distribution uses (the hub's `kernels`, imported by transformers >= 5.2x)
CHECKOUT_FOLDERS = ("kernels", "integrations", "tests", "bench")


def _in_root(code: str, **env) -> subprocess.CompletedProcess:
    """`python -c code` with the repository root as the current directory (sys.path[0])."""
    import os

    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                          env={**os.environ, **env}, timeout=300)


def test_no_checkout_folder_is_a_regular_package():
    """A folder with __init__.py would win over an installed distribution of the same name."""
    assert not [n for n in CHECKOUT_FOLDERS if (ROOT / n / "__init__.py").exists()]


def test_the_hubs_kernels_wins_in_the_root_and_transformers_imports():
    pytest.importorskip("kernels", reason="the hub's `kernels` (a transformers dependency) is not installed")
    code = ("import kernels, pathlib; f = kernels.__file__ or '';"
            f"assert 'site-packages' in f and not f.startswith({str(ROOT)!r} + '/kernels'), f;"
            "from transformers import LlamaForCausalLM, Qwen2ForCausalLM, Gemma2ForCausalLM;"
            "import agentrt.kernels.reference, agentrt.integrations.langgraph; print('ok')")
    out = _in_root(code)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]


def test_installed_distributions_win_over_every_checkout_folder(tmp_path):
    """Whatever the current directory, `import <folder>` finds an installed package of that name."""
    for name in CHECKOUT_FOLDERS:
        (tmp_path / name).mkdir()
        (tmp_path / name / "__init__.py").write_text(f"WHO = 'installed {name}'\n")
    code = ("import importlib;"
            f"print(*[importlib.import_module(n).WHO for n in {CHECKOUT_FOLDERS!r}], sep=',')")
    out = _in_root(code, PYTHONPATH=str(tmp_path))
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().split(",") == [f"installed {n}" for n in CHECKOUT_FOLDERS]


def test_this_session_loaded_no_second_copy_of_a_module():
    """Every module loaded from kernels/ or integrations/ is agentrt.<...>, never `kernels.x`."""
    roots = tuple(str(ROOT / n) + "/" for n in ("kernels", "integrations"))
    dup = [name for name, mod in list(sys.modules.items())
           if (getattr(mod, "__file__", None) or "").startswith(roots) and not name.startswith("agentrt.")]
    assert not dup
