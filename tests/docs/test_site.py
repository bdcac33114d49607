"""The documentation site builds strictly: `mkdocs build --strict` fails on any warning (a broken link or anchor,
a page missing from the nav, a route of the app the generated reference does not describe), and the generated
reference pages hold what the code defines."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

from coding_agent_env.observe.metrics import PREFIX
from coding_agent_env.settings import Settings
from tests.docs.pages import ROOT, SHOWN, RUNNABLE, fence_tags, page_id, pages

BUILD_DEADLINE_S = 300


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if importlib.util.find_spec("mkdocs") is None or importlib.util.find_spec("material") is None:
        pytest.skip("mkdocs is not installed: pip install -e '.[docs]' (scripts/test installs it)")
    out = tmp_path_factory.mktemp("site")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=BUILD_DEADLINE_S)
    assert done.returncode == 0, f"mkdocs build --strict failed:\n{done.stdout}\n{done.stderr}"
    assert "WARNING" not in done.stderr, done.stderr
    return out


def test_site_builds_strictly(site: Path) -> None:
    for page in ("index.html", "tutorials/first-episode/index.html", "reference/settings/index.html"):
        assert (site / page).is_file(), page


def test_settings_reference_names_every_setting(site: Path) -> None:
    html = (site / "reference/settings/index.html").read_text()
    missing = [name.upper() for name in Settings.model_fields if name != "backends" and name.upper() not in html]
    assert not missing, f"settings missing from the reference: {missing}"


def test_metrics_and_routes_references_are_the_codes(site: Path) -> None:
    metrics = (site / "reference/metrics/index.html").read_text()
    assert f"{PREFIX}rollouts_finished_total" in metrics and f"{PREFIX}episode_calls_total" in metrics
    routes = (site / "reference/routes/index.html").read_text()
    for path in ("/ws", "/mcp", "/health/loop", "/images", "/{env}/task_range"):
        assert f"<code>{path}</code>" in routes, path


@pytest.mark.parametrize("page", pages(), ids=page_id)
def test_every_code_block_says_whether_it_runs(page: Path) -> None:
    """A fence tag outside the two sets would be a block nobody runs by mistake (`pyhton`), or an untagged one."""
    unknown = [tag for tag in fence_tags(page.read_text()) if tag not in RUNNABLE and tag not in SHOWN]
    assert not unknown, f"{page_id(page)}: code fences tagged {unknown}: use {RUNNABLE} to run, or one of {sorted(SHOWN)}"
