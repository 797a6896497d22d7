"""The dashboard in a real browser: headless Chromium through Playwright, against a running
3-agent workload (tests/dashboard_util.py). The page loads, shows the three agents, its charts
and timeline update as turns complete, and the console stays clean. A screenshot is saved as a
test artifact: in the test's tmp dir and as tests/artifacts/dashboard.png (ignored by git).

Chromium: $AGENTRT_CHROMIUM, else `chromium` / `chromium-browser` on PATH (Debian's `chromium`
package; `make test` installs it with apt-get where it can: .ci/ensure_chromium). Playwright's own
browser download is not used. Without both, the test is skipped and says why."""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import pytest

sync_api = pytest.importorskip("playwright.sync_api", reason="the browser test needs playwright (the dev extra)")

from tests.dashboard_util import AGENTS, Workload  # noqa: E402

ARTIFACTS = Path(__file__).parent / "artifacts"


def _chromium() -> str:
    for path in (os.environ.get("AGENTRT_CHROMIUM"), shutil.which("chromium"), shutil.which("chromium-browser")):
        if path and os.access(path, os.X_OK):
            return path
    pytest.skip("no Chromium found: install Debian's `chromium` (make test does, with apt-get as root) or set "
                "AGENTRT_CHROMIUM to a Chromium executable")


def _wait(page, js: str, timeout_s: float = 20.0):
    page.wait_for_function(js, timeout=timeout_s * 1000)


@pytest.mark.slow
def test_the_dashboard_shows_a_running_workload(tmp_path):
    chromium = _chromium()
    errors: list[str] = []
    with Workload() as work, sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium, headless=True, args=["--disable-gpu"])
        page = browser.new_page(viewport={"width": 1400, "height": 1500})
        page.on("console", lambda m: m.type == "error" and errors.append(m.text))
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.goto(work.url)
        # the page loads and shows the three agents
        _wait(page, "Number(document.body.dataset.updates || 0) >= 1")
        _wait(page, f"document.querySelectorAll('#agents tbody tr[data-agent]').length === {len(AGENTS)}")
        names = page.eval_on_selector_all("#agents tbody tr[data-agent]", "rows => rows.map(r => r.dataset.agent)")
        assert sorted(names) == sorted(AGENTS)
        # the charts and the timeline update as turns complete
        first = page.evaluate("() => ({points: window.agentrtDashboard.history.length, turns: "
                              "Number(document.querySelector('#timeline').dataset.turns), decoded: "
                              "window.agentrtDashboard.history.at(-1).decode_tokens})")
        turns_before = work.turns
        _wait(page, f"window.agentrtDashboard.history.at(-1).decode_tokens > {first['decoded']} && "
                    f"Number(document.querySelector('#timeline').dataset.turns) > {first['turns']}")
        # (the page polls the engine, which records a turn before the workload's ask returns to
        # count it: under load the page can be first, so the count is waited for, not raced)
        deadline = time.monotonic() + 20.0
        while work.turns <= turns_before and time.monotonic() < deadline:
            time.sleep(0.05)
        assert work.turns > turns_before
        points = int(page.get_attribute("#chart-kv", "data-points"))
        assert points > first["points"] and page.locator("#chart-kv canvas").count() == 1
        assert page.locator("#timeline rect.seg.decode").count() >= 1
        # the workflow DAG: the three stages, edges between them
        assert page.locator("#workflows g.node").count() == len(AGENTS)
        assert page.locator("#workflows path.edge").count() == len(AGENTS) - 1
        assert page.inner_text("#status") == "live"
        _wait(page, "Number(document.querySelector('#timeline').dataset.turns) >= 9")  # (a fuller picture)
        shot = tmp_path / "dashboard.png"
        page.screenshot(path=str(shot), full_page=True)
        browser.close()
    ARTIFACTS.mkdir(exist_ok=True)
    shutil.copy(shot, ARTIFACTS / "dashboard.png")
    assert shot.stat().st_size > 10_000
    assert not errors, f"console errors: {errors}"
