"""`settings.secrets`: a process re-executes itself without the operator secrets in its environment and reads them
back from the memfd it handed over (INTEGRITY 38). Each case runs a small real program in a subprocess (the exec
replaces it) and reads what the kernel shows of it: `/proc/self/environ`, its descriptors, a child's."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from coding_agent_env.settings.secrets import SECRETS_FD_VARIABLE, secret_variables

ROOT = Path(__file__).resolve().parents[2]
KEY = "sk-handover-1f2e"
HF = "hf_handoverToken9"

PROGRAM = r"""
import json, os, subprocess, sys
from coding_agent_env.settings.secrets import reexec_without_secrets
reexec_without_secrets()
from coding_agent_env.settings import Settings
from huggingface_hub import get_token
settings = Settings.from_env()
child = subprocess.run(["sh", "-c", "cat /proc/self/environ; ls -l /proc/self/fd/"], capture_output=True)
print(json.dumps({
    "key": settings.openai_api_key.get_secret_value() if settings.openai_api_key else None,
    "hf": settings.hf_token.get_secret_value() if settings.hf_token else None,
    "hub": get_token(),
    "environ": open("/proc/self/environ", "rb").read().decode("latin-1"),
    "cmdline": open("/proc/self/cmdline", "rb").read().decode("latin-1"),
    "fds": sorted(os.readlink(f"/proc/self/fd/{fd}") for fd in os.listdir("/proc/self/fd")
                  if os.path.exists(f"/proc/self/fd/{fd}")),
    "child": child.stdout.decode("latin-1"),
    "argv": sys.argv[1:],
}))
"""


def run(env: dict[str, str], *args: str) -> dict:
    base = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONPATH": str(ROOT), "HOME": "/nonexistent"}
    done = subprocess.run([sys.executable, "-c", PROGRAM, *args], env={**base, **env}, capture_output=True,
                          text=True, timeout=60, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_secrets_leave_the_environment_and_are_still_read() -> None:
    out = run({"OPENAI_API_KEY": KEY, "HF_TOKEN": HF, "OPENAI_MODEL": "kept"}, "--flag", "value")
    assert (out["key"], out["hf"]) == (KEY, HF)
    assert out["hub"] == HF, "huggingface_hub (the hf backend's Jobs) no longer finds the token"
    for text in (out["environ"], out["cmdline"], out["child"]):
        assert KEY not in text and HF not in text
    assert "OPENAI_MODEL=kept" in out["environ"] and out["argv"] == ["--flag", "value"]
    assert not [fd for fd in out["fds"] if "coding-agent-env-secrets" in fd], "the handover memfd stays open"
    assert "coding-agent-env-hf-token" not in out["child"], "a child inherited the hub token's descriptor"


def test_nothing_to_hide_means_no_exec() -> None:
    out = run({"OPENAI_MODEL": "kept"})
    assert out["key"] is None and SECRETS_FD_VARIABLE not in out["environ"]


def test_an_unreadable_handover_is_a_clear_settings_error() -> None:
    done = subprocess.run([sys.executable, "-c", "from coding_agent_env.settings import Settings; Settings.from_env()"],
                          env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT), SECRETS_FD_VARIABLE: "987"},
                          capture_output=True, text=True, timeout=60)
    assert done.returncode != 0 and f"{SECRETS_FD_VARIABLE}: the secrets handed over cannot be read" in done.stderr


@pytest.mark.parametrize("name", ["OPENAI_API_KEY", "HF_TOKEN", "HF_ROUTER_API_KEY", "VLLM_API_KEY", "API_TOKEN",
                                  "METRICS_TOKEN", "E2B_API_KEY", "HF_SANDBOX_TOKEN", "LLM_ENDPOINTS", "RESULTS_DB"])
def test_every_secret_the_settings_read_is_hidden(name: str) -> None:
    assert name in secret_variables()


def test_reload_keeps_them_and_says_so(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    from coding_agent_env.serve import hide_secrets

    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    hide_secrets(reload=True)  # returns: with --reload nothing is re-executed
    err = capsys.readouterr().err
    assert "--reload" in err and "OPENAI_API_KEY" in err and KEY not in err


@pytest.mark.parametrize("value", ["", "  "])
def test_a_blank_api_token_is_refused_not_taken_as_open(value: str) -> None:
    from coding_agent_env.errors import SettingsError
    from coding_agent_env.settings import Settings

    with pytest.raises(SettingsError, match="API_TOKEN: Value error, is empty"):
        Settings.from_env({"API_TOKEN": value})


RESTARTING = r"""
import json, os, sys
from coding_agent_env.settings.secrets import reexec_without_secrets
with open(sys.argv[1], "a") as starts:
    starts.write("start\n")
os.environ["OPENAI_API_KEY"] = sys.argv[2]  # what a launcher's env file does at every start (uvicorn --env-file)
reexec_without_secrets()
from coding_agent_env.settings import Settings
settings = Settings.from_env()
print(json.dumps({"key": settings.openai_api_key.get_secret_value(), "in_os_environ": "OPENAI_API_KEY" in os.environ,
                  "environ": open("/proc/self/environ", "rb").read().decode("latin-1")}))
"""


def test_secrets_a_launcher_puts_back_at_every_start_are_taken_once_not_reexecuted_forever(tmp_path: Path) -> None:
    """A launcher that loads an env file into `os.environ` before it imports the app (uvicorn `--env-file`) puts
    the secrets back at every start: the image that was re-executed takes them out of `os.environ` (they were never
    in its exec-time environment) instead of re-executing again, which would loop forever."""
    starts = tmp_path / "starts"
    base = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONPATH": str(ROOT), "HOME": "/nonexistent"}
    done = subprocess.run([sys.executable, "-c", RESTARTING, str(starts), KEY], env=base, capture_output=True,
                          text=True, timeout=30, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert starts.read_text().count("start") == 2
    assert out["key"] == KEY and not out["in_os_environ"] and KEY not in out["environ"]
