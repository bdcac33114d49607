"""No agent makes network traffic other than its LLM calls: update checks, telemetry, plugin catalogs and the
like are switched off in each agent's configuration, not left to fail against the sandbox's empty network
(a lookup that fails there can still cost seconds of resolver timeouts per rollout).

The whole rollout (server side and sandbox) runs in a child process under strace (`-f` follows it into the
sandbox); every IPv4/IPv6 address any of its processes connects or sends to is collected. The rollout is
the real one on the local backend with the real agent binaries; the LLM is the scripted fake (no real model
here), which listens on loopback."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from coding_agent_env.models import RolloutResult, RolloutStatus
from coding_agent_env.settings import Settings
from tests.agents.conftest import SERVER_KEY
from tests.agents.sessions import AGENTS, CORRECT, TASK, VERIFY, session, write_file_command
from tests.fakes.llm import FakeLLMServer

ROOT = Path(__file__).resolve().parents[2]
ADDRESS = re.compile(
    r'sa_family=AF_INET6?, sin6?_port=htons\((?P<port>\d+)\),[^}]*?'
    r'(?:inet_addr\("(?P<v4>[^"]+)"\)|inet_pton\(AF_INET6, "(?P<v6>[^"]+)")'
)
LOOPBACK = re.compile(r"^(127\.\d+\.\d+\.\d+|::1|::ffff:127\.\d+\.\d+\.\d+)$")


def destinations(trace: str) -> set[tuple[str, int]]:
    """(address, port) of every connect / sendto / sendmsg with an IP address in an strace log."""
    return {(m["v4"] or m["v6"], int(m["port"])) for m in ADDRESS.finditer(trace)}


def test_destinations_parser_reads_both_families() -> None:
    trace = (
        '12 connect(3, {sa_family=AF_INET, sin_port=htons(53), sin_addr=inet_addr("10.0.0.53")}, 16) = -1\n'
        '13 sendto(4, "x", 1, 0, {sa_family=AF_INET6, sin6_port=htons(443), sin6_flowinfo=htonl(0), '
        'inet_pton(AF_INET6, "2001:db8::1", &sin6_addr), sin6_scope_id=0}, 28) = -1\n'
        '14 connect(5, {sa_family=AF_UNIX, sun_path="/run/x"}, 110) = 0\n'
    )
    assert destinations(trace) == {("10.0.0.53", 53), ("2001:db8::1", 443)}


@pytest.mark.usefixtures("assert_no_leftovers")
@pytest.mark.parametrize("agent", AGENTS)
def test_agent_calls_nothing_but_the_llm(
    agent: str, fake: FakeLLMServer, settings: Settings, state_dir: Path, require_agent: Callable[[str], None],
    tmp_path: Path,
) -> None:
    require_agent(agent)
    strace = shutil.which("strace")
    assert strace, "strace is needed for this test (.ci/run installs it)"
    fake.app.script = session(agent, write_file_command("binary_search.py", CORRECT))
    request = {"instruction": TASK, "agent": agent, "base_url": fake.base_url, "api_key": SERVER_KEY,
               "model": "fake/coder-1", "verify": VERIFY, "agent_timeout_s": 120}
    args = {"request": request, "state_dir": str(state_dir), "uid_base": settings.backends[0].uid_base}
    log = tmp_path / "strace.log"
    done = subprocess.run(
        [strace, "-f", "-qq", "--seccomp-bpf", "-e", "trace=connect,sendto,sendmsg,sendmmsg", "-e", "signal=none",
         "-o", str(log), sys.executable, "-m", "tests.agents.traced_rollout"],
        input=json.dumps(args).encode(), capture_output=True, cwd=ROOT, timeout=300, check=False,
    )
    assert done.returncode == 0, done.stderr.decode(errors="replace")[-3000:]
    result = RolloutResult.model_validate_json(done.stdout)
    assert result.status is RolloutStatus.COMPLETED and result.reward == 1.0, (result.error, result.agent_log_tail)
    seen = destinations(log.read_text(errors="replace"))
    # The relay (in the sandbox, and the server's own) and the fake LLM are all this rollout may reach.
    assert seen, "the trace saw no connection at all: the tracer did not follow the rollout"
    stray = {(address, port) for address, port in seen if not LOOPBACK.match(address) or port == 53}
    assert not stray, f"{agent} reached beyond its LLM: {sorted(stray)}"
