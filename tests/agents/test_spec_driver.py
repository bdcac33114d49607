"""Spec contracts, the launcher, install bookkeeping, and the not-installed path through the pipeline."""

from __future__ import annotations

import dataclasses
import json
import shlex
import subprocess
from pathlib import Path

import pytest

from coding_agent_env.agents.claude_code import CLAUDE_CODE
from coding_agent_env.agents.codex import CODEX
from coding_agent_env.agents.driver import launcher_script
from coding_agent_env.agents.gemini_cli import GEMINI_CLI
from coding_agent_env.agents.install import MARKER, AgentNotInstalledError, check_installed, status
from coding_agent_env.agents.mini_swe_agent import MINI_SWE_AGENT, parse_mini_events
from coding_agent_env.agents.opencode import OPENCODE
from coding_agent_env.agents.pi import PI
from coding_agent_env.agents.qwen_code import QWEN_CODE
from coding_agent_env.agents.registry import cli_specs, get_agent
from coding_agent_env.agents.spec import AgentFile, HomeLink, Launch, LaunchContext, NpmPackage, PipPackage, SpecError
from coding_agent_env.errors import UnknownAgentError
from coding_agent_env.models import RolloutRequest, RolloutStatus
from coding_agent_env.rollout import run_rollout
from coding_agent_env.settings import Settings

TOKEN = "tok-'$(touch /tmp/pwn)'-secret"
CTX = LaunchContext(base_url="http://127.0.0.1:8765/v1", token=TOKEN, model="m'; rm -rf / #", home="/home/sandbox",
                    workdir="/workspace", agent_dir="/logs/agent dir", prefix="/opt/agents/x-1.0.0", title="t")


def test_registry_knows_every_agent_and_specs_are_pinned() -> None:
    assert {spec.name for spec in cli_specs()} == {"opencode", "pi", "qwen-code", "mini-swe-agent", "claude-code",
                                                   "codex", "gemini-cli"}  # Terminus runs in the server
    assert (OPENCODE.version, PI.version, QWEN_CODE.version, MINI_SWE_AGENT.version, CLAUDE_CODE.version,
            CODEX.version, GEMINI_CLI.version) == ("1.18.33", "0.73.1", "0.24.4", "2.4.6", "2.1.331", "0.169.0", "0.61.0")
    with pytest.raises(SpecError):
        PipPackage("mini-swe-agent", ">=2.4")
    assert get_agent("opencode").needs_llm and get_agent("terminus").needs_llm
    with pytest.raises(SpecError):
        NpmPackage("opencode-ai", "^1.18.33")
    with pytest.raises(SpecError):
        dataclasses.replace(OPENCODE, version="1.18.34")  # the pinned package no longer matches


@pytest.mark.parametrize("spec", [OPENCODE, PI, QWEN_CODE, MINI_SWE_AGENT, CLAUDE_CODE, CODEX, GEMINI_CLI],
                         ids=lambda s: s.name)
def test_token_only_in_env_or_private_files(spec) -> None:  # type: ignore[no-untyped-def]
    launch = spec.launch(CTX)
    assert not any(TOKEN in arg for arg in launch.argv)
    holders = [f for f in launch.files if TOKEN in f.content]
    assert all(f.mode == 0o600 for f in holders)
    assert holders or any(TOKEN in value for value in launch.env.values())


def test_spec_refuses_a_leaky_render() -> None:
    leaky_argv = dataclasses.replace(PI, render=lambda ctx: Launch(argv=("pi", "--api-key", ctx.token)))
    with pytest.raises(SpecError, match="argv"):
        leaky_argv.launch(CTX)
    leaky_file = dataclasses.replace(PI, render=lambda ctx: Launch(argv=("pi",), files=(AgentFile("/x", ctx.token, 0o644),)))
    with pytest.raises(SpecError, match="0600"):
        leaky_file.launch(CTX)
    with pytest.raises(SpecError):
        HomeLink("../etc", ".config/x")


def test_launcher_quotes_every_word(tmp_path: Path) -> None:
    """Run the launcher for real: hostile argv, paths with spaces; stdin is the instruction file."""
    prefix, home = tmp_path / "pre fix", tmp_path / "ho me"
    (prefix / "plugin").mkdir(parents=True)
    (prefix / "plugin" / "package.json").write_text("{}")
    instruction, events = tmp_path / "in struction", tmp_path / "ev ents"
    instruction.write_text("$(touch pwn) `touch pwn`")
    ctx = dataclasses.replace(CTX, prefix=str(prefix), home=str(home))
    argv = ("python3", "-c", "import sys; print(repr(sys.argv[1:])); print(sys.stdin.read())", "a b", "$(touch pwn)", "'")
    links = (HomeLink("plugin", ".config/x/plugin"), HomeLink("plugin/package.json", ".config/x/p.json", copy=True))
    script = launcher_script(Launch(argv=argv, links=links), ctx, str(instruction), str(events))
    done = subprocess.run(["bash", "-c", script], cwd=tmp_path, capture_output=True, timeout=30, check=False)
    assert done.returncode == 0, done.stderr
    assert events.read_text() == "['a b', '$(touch pwn)', \"'\"]\n$(touch pwn) `touch pwn`\n"
    assert not (tmp_path / "pwn").exists()
    assert (home / ".config/x/plugin").is_symlink() and (home / ".config/x/p.json").read_text() == "{}"
    assert shlex.quote(str(instruction)) in script


def test_install_status_names_the_install_command(tmp_path: Path) -> None:
    with pytest.raises(AgentNotInstalledError, match="coding-agent-env agents install"):
        check_installed(OPENCODE, tmp_path)
    prefix = tmp_path / OPENCODE.prefix_name
    prefix.mkdir()
    (prefix / MARKER).write_text(json.dumps({"agent": "opencode", "version": "0.0.1", "packages": []}))
    assert "stale" in status(OPENCODE, tmp_path).detail
    get_agent("terminus").check_available(Settings(agents_dir=tmp_path))  # built in: nothing to install


async def test_missing_agent_is_refused_before_anything_starts(settings: Settings, tmp_path: Path) -> None:
    empty = settings.model_copy(update={"agents_dir": tmp_path / "none"})
    request = RolloutRequest(instruction="x", agent="opencode", base_url="http://127.0.0.1:9/v1", api_key="k", model="m")
    with pytest.raises(UnknownAgentError, match="coding-agent-env agents install"):
        await run_rollout(request, settings=empty)
    assert not list(settings.state_dir.iterdir()), "no sandbox was made"


def test_stream_json_events_are_summarised() -> None:
    """Qwen Code's stream-json, as it printed it for a real run (shortened), plus a broken line."""
    from coding_agent_env.agents.stream_json import parse_stream_json

    text = "\n".join([
        '{"type":"system","subtype":"init","model":"m"}',
        '{"type":"assistant","message":{"role":"assistant","content":[{"type":"text","text":"Running."}]}}',
        '{"type":"assistant","message":{"role":"assistant","content":[{"type":"tool_use","id":"call_0",'
        '"name":"run_shell_command","input":{"command":"echo hi"}}],"stop_reason":"tool_use"}}',
        '{"type":"user","message":{"role":"user","content":[{"type":"tool_result","tool_use_id":"call_0"}]}}',
        "{not json",
        '{"type":"result","subtype":"success","is_error":false,"num_turns":2,"result":"done",'
        '"usage":{"input_tokens":9870,"output_tokens":5,"total_tokens":9875}}',
    ])
    report = parse_stream_json(text)
    assert (report.steps, report.tokens, report.malformed, report.errors) == (2, 9875, 1, [])
    assert report.texts == ["Running."] and report.tool_calls[0][0] == "run_shell_command"
    failed = parse_stream_json('{"type":"result","subtype":"error_max_turns","is_error":true}')
    assert failed.errors == ["error_max_turns"]


def test_mini_swe_agent_events_are_summarised() -> None:
    call = {"function": {"name": "bash", "arguments": '{"command": "ls"}'}}
    text = "\n".join([
        '{"type": "message", "message": {"role": "system", "content": "sys"}}',
        json.dumps({"type": "message", "message": {"role": "assistant", "content": "Looking.", "tool_calls": [call],
                                                   "extra": {"response": {"usage": {"total_tokens": 40}}}}}),
        '{"type": "message", "message": {"role": "tool", "content": "a.txt"}}',
        "{broken",
        '{"type": "result", "exit_status": "Submitted", "submission": ""}',
    ])
    report = parse_mini_events(text)
    assert (report.steps, report.tokens, report.malformed, report.errors) == (1, 40, 1, [])
    assert report.texts == ["Looking."] and report.tool_calls[0][0] == "bash"
    assert parse_mini_events('{"type": "result", "exit_status": "LimitsExceeded"}').errors == ["LimitsExceeded"]
