"""Operator secrets out of the server's process environment (INTEGRITY 38), on the real server.

The server is started the ways the README offers (`coding-agent-env serve`, `uvicorn server.app:app`) with fake
secrets in its environment. Afterwards `/proc/<server pid>/environ` (what the kernel shows: the exec-time block,
which `del os.environ[...]` would not change) and the environment of every process the server started during a
rollout hold none of them, while the server still uses the key: the fake LLM upstream (a scripted ASGI app, the
real thing being a paid API) answers only `Authorization: Bearer <key>`. The secrets are in no argv and no log.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from coding_agent_env.client import CodingAgentEnv
from coding_agent_env.settings import LocalConfig, Settings
from tests.fakes.llm import FakeLLM, FakeLLMServer, Reply
from tests.helpers import free_port, poll, serving, wait_until

ROOT = Path(__file__).resolve().parents[2]
KEY = "sk-fake-openai-7d1c0e"
HF = "hf_fakeHubToken42aa"
TOKEN = "caller-token-93f1b2"
E2B = "e2b_fake_key_5a6b"
SECRETS = (KEY, HF, TOKEN, E2B)
START_DEADLINE_S = 60.0
GO = "proceed"
CHILD_WAIT_POLLS = 3000
"""How often (every 20 ms) the oracle's command looks for the file this test writes: a minute at most."""


def descendants(pid: int) -> list[int]:
    """Every live descendant of `pid` (from /proc's parent links)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry.name))
    found, todo = [], list(children.get(pid, []))
    while todo:
        child = todo.pop()
        found.append(child)
        todo += children.get(child, [])
    return found


def proc_bytes(pid: int, name: str) -> bytes:
    try:
        return Path(f"/proc/{pid}/{name}").read_bytes()
    except OSError:  # gone meanwhile
        return b""


def leaked(pid: int) -> list[str]:
    """Which secrets `pid`'s kernel-visible environment or argv holds."""
    seen = proc_bytes(pid, "environ") + proc_bytes(pid, "cmdline")
    return [secret for secret in SECRETS if secret.encode() in seen]


@pytest.fixture
def upstream() -> Iterator[tuple[FakeLLM, FakeLLMServer]]:
    answer = json.dumps({"command": "echo hi > answer.txt"})
    done = json.dumps({"final_answer": "done"})
    app = FakeLLM(script=[Reply(content=None, tool_calls=(("terminal", answer),)),
                          Reply(content=None, tool_calls=(("terminal", done),))], api_key=KEY)
    with FakeLLMServer(app) as server:
        yield app, server


def start(argv: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:
        return subprocess.Popen(argv, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(15)


def server_env(settings: Settings, base_url: str, port: int) -> dict[str, str]:
    keep = {name: os.environ[name] for name in ("PATH", "HOME", "LANG") if name in os.environ}
    local = settings.backend_config("local")
    assert isinstance(local, LocalConfig)
    return {**keep, "OPENAI_API_KEY": KEY, "OPENAI_BASE_URL": base_url, "OPENAI_MODEL": "fake-model",
            "HF_TOKEN": HF, "API_TOKEN": TOKEN, "E2B_API_KEY": E2B, "LLM_DEFAULT_ENDPOINT": "openai",
            "STATE_DIR": str(settings.state_dir), "SANDBOX_UID_BASE": str(local.uid_base),
            "SANDBOX_UID_COUNT": str(local.uid_count), "ENABLE_WEB_INTERFACE": "false", "PORT": str(port),
            "PYTHONPATH": str(ROOT)}


async def llm_rollout(url: str) -> Any:
    """A Terminus rollout through the server's `openai` entry: the server sends its key to the fake upstream."""
    async with CodingAgentEnv(url, api_token=TOKEN) as env:
        await env.reset()
        return await env.run_rollout(instruction="write answer.txt", agent="terminus", endpoint="openai",
                                     verify=["test -s answer.txt"])


async def children_during_rollout(url: str, server_pid: int, state_dir: Path) -> list[int]:
    """The processes the server runs for an oracle rollout whose command waits (bounded) for a file this test
    writes into its workdir once it has read them; their pids."""
    wait = f"for i in $(seq {CHILD_WAIT_POLLS}); do [ -e {GO} ] && break; sleep 0.02; done"
    async with CodingAgentEnv(url, api_token=TOKEN) as env:
        await env.reset()
        rollout = asyncio.ensure_future(env.run_rollout(instruction="wait", agent="oracle", solution=[wait],
                                                        verify=[f"test -e {GO}"]))
        try:
            workdir = await poll(lambda: rollout.done() or next(state_dir.glob("*/work"), None),
                                 "the rollout's workdir", timeout_s=START_DEADLINE_S)
            assert isinstance(workdir, Path), "the rollout ended before its workdir was seen"
            children = await poll(lambda: descendants(server_pid), "the server's children", timeout_s=30)
            for pid in children:  # read while they run
                if found := leaked(pid):
                    raise AssertionError(f"process {pid} the server started holds {found}")
            (workdir / GO).write_text("")
            assert (await rollout).reward == 1.0
            return children
        finally:
            rollout.cancel()


CONSOLE_SCRIPT = "import sys\nfrom uvicorn.main import main\nsys.exit(main())\n"
"""What pip writes as the `uvicorn` command (the image's CMD runs it); the test's venv may have none of its own."""


def uvicorn_script(directory: Path) -> str:
    script = directory / "bin" / "uvicorn"
    script.parent.mkdir(exist_ok=True)
    script.write_text(CONSOLE_SCRIPT)
    return str(script)


WAYS = {
    "serve": lambda port, _: [sys.executable, "-m", "coding_agent_env.cli", "serve", "--port", str(port)],
    "python -m uvicorn": lambda port, _: [sys.executable, "-m", "uvicorn", "server.app:app", "--port", str(port)],
    "uvicorn": lambda port, tmp: [sys.executable, uvicorn_script(tmp), "server.app:app", "--port", str(port)],
}


@pytest.mark.parametrize("way", sorted(WAYS))
def test_secrets_leave_the_server_environment_and_the_key_still_works(
    way: str, tmp_path: Path, settings: Settings, upstream: tuple[FakeLLM, FakeLLMServer]
) -> None:
    app, fake = upstream
    port = free_port()
    log = tmp_path / "server.log"
    proc = start(WAYS[way](port, tmp_path), server_env(settings, fake.base_url, port), log)
    try:
        wait_until(serving(f"http://127.0.0.1:{port}/health", proc, log.read_text), "the server to answer /health",
                   timeout_s=START_DEADLINE_S)
        assert leaked(proc.pid) == [], f"the server's /proc/{proc.pid}/environ or cmdline holds secrets"
        url = f"http://127.0.0.1:{port}"
        result = asyncio.run(llm_rollout(url))
        assert result.reward == 1.0, result.model_dump_json(indent=1)[:6000]
        calls = [r for r in app.requests if r.path == "/v1/chat/completions"]
        assert calls and all(r.headers.get("authorization") == f"Bearer {KEY}" for r in calls), \
            "the server no longer sends the operator's key upstream"
        children = asyncio.run(children_during_rollout(url, proc.pid, settings.state_dir))
        assert children, "no process of the server was seen while its rollout ran"
        assert {pid: found for pid in children if (found := leaked(pid))} == {}, "a child holds secrets"
        assert leaked(proc.pid) == []
        fds = [os.readlink(f) for f in Path(f"/proc/{proc.pid}/fd").iterdir() if f.exists()]
        assert not [fd for fd in fds if "coding-agent-env-secrets" in fd], "the handover memfd is still open"
    finally:
        stop(proc)
    text = log.read_text()
    assert "Uvicorn running" in text or "Application startup complete" in text
    assert [secret for secret in SECRETS if secret in text] == [], "a secret reached the server's log"
