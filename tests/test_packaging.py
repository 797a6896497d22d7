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
