"""Examples that cannot rot: every runnable code block of README.md and the docs (fence tag `python` or `bash`,
tests/docs/pages.py) runs here, found by mktestdocs, against a real server this test starts on loopback.

The pages address the server as a reader's would be, `127.0.0.1:8000`; each block runs with that replaced by the
live server's address (tests.protocol.live: real uvicorn, real sockets, the local bubblewrap backend), and with
`.venv/bin/` replaced by this interpreter's directory (the same install, however the suite was started). A page's
`python` blocks run in order in one namespace, as a reader's session would; its `bash` blocks run in the
repository's root under `bash -euo pipefail`, with STATE_DIR and the sandbox uid range of the test's own settings.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import coding_agent_env.api  # noqa: F401  (imported at collection: a live server's start then only builds the app)
from coding_agent_env.settings import LocalConfig, Settings
from tests.docs.pages import ROOT, page_id, pages

mktestdocs = pytest.importorskip("mktestdocs", reason="mktestdocs is not installed: pip install -e '.[docs]'")

DOCS_ADDRESS = "127.0.0.1:8000"
BLOCK_DEADLINE_S = 300


def blocks(page: Path, lang: str) -> list[str]:
    return mktestdocs.grab_code_blocks(page.read_text(), lang=lang)


RUNNABLE_PAGES = [page for page in pages() if blocks(page, "python") or blocks(page, "bash")]


def localise(code: str, address: str) -> str:
    return code.replace(DOCS_ADDRESS, address).replace(".venv/bin/", f"{Path(sys.executable).parent}/")


def test_readme_and_tutorials_have_runnable_examples() -> None:
    """The README's first five minutes and every tutorial are among the pages run here."""
    ran = {page_id(page) for page in RUNNABLE_PAGES}
    expected = {"README.md", *(page_id(p) for p in (ROOT / "docs" / "tutorials").glob("*.md"))}
    expected.discard("docs/tutorials/first-trl-run.md")  # TRL and torch: tests/harness/test_trl_grpo.py runs it
    assert expected <= ran, f"pages with no runnable block: {sorted(expected - ran)}"


@pytest.mark.parametrize("page", RUNNABLE_PAGES, ids=page_id)
def test_page_examples_run(page: Path, make_live: Callable[..., Any], settings: Settings,
                           monkeypatch: pytest.MonkeyPatch, assert_no_leftovers: None) -> None:
    live = make_live(enable_web_interface=False)
    address = f"127.0.0.1:{live.port}"
    local = settings.backend_config("local")
    assert isinstance(local, LocalConfig)
    env = {"STATE_DIR": str(settings.state_dir), "SANDBOX_UID_BASE": str(local.uid_base),
           "SANDBOX_UID_COUNT": str(local.uid_count)}
    for name, value in env.items():
        monkeypatch.setenv(name, value)  # in-process rollouts of the python blocks read Settings.from_env()
    monkeypatch.chdir(ROOT)
    for number, code in enumerate(blocks(page, "bash"), 1):
        run_bash(f"{page_id(page)} bash block {number}", localise(code, address))
    namespace: dict[str, Any] = {"__name__": "__main__"}
    for number, code in enumerate(blocks(page, "python"), 1):
        where = f"{page_id(page)} python block {number}"
        try:
            exec(compile(localise(code, address), where, "exec"), namespace)
        except Exception as exc:
            raise AssertionError(f"{where} failed ({type(exc).__name__}: {exc}):\n{code}") from exc
    shutil.rmtree(settings.state_dir / "runs", ignore_errors=True)  # batches' journals: output, not a leftover


def run_bash(where: str, code: str) -> None:
    """Run one block in a process group of its own, killed whole if the block outlives its deadline."""
    process = subprocess.Popen(["bash", "-euo", "pipefail", "-c", code], cwd=ROOT, env=dict(os.environ),
                               stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               start_new_session=True)
    try:
        stdout, stderr = process.communicate(timeout=BLOCK_DEADLINE_S)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        stdout, stderr = process.communicate()
        raise AssertionError(f"{where} ran past {BLOCK_DEADLINE_S}s (killed):\n{code}\n{stdout}\n{stderr}") from None
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)  # anything the block left running in the background
    assert process.returncode == 0, f"{where} exited {process.returncode}:\n{code}\n--- stdout\n{stdout}\n--- stderr\n{stderr}"
