"""mini-swe-agent 2.4.6 (PyPI `mini-swe-agent`), as a `CliAgentSpec`. Dialect: OpenAI chat completions (its
LiteLLM model class, provider `openai/` pointed at the relay).

Installed into its own virtualenv in the agent's prefix (made by the system Python, which sandboxes see). Its
`mini` command takes the task in argv, which would put the instruction on the command line; so the agent runs
through a small runner of ours (`runner.py`, written into the agent dir) that reads the instruction from stdin and
drives mini-swe-agent's own `DefaultAgent` with its `LitellmModel` and `LocalEnvironment` (commands run in the
workdir, inside the sandbox). The task is the first user message verbatim (`instance_template` is the task);
the system prompt says how to work and finish (`echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT`). No cost limit
(a local model has no price), LiteLLM's cost map read locally, no telemetry. The runner prints one JSON line per
message and a final `result` line (`exit_status`); it exits 0 only when the agent submitted.
"""

from __future__ import annotations

from typing import Any

from coding_agent_env.agents.event_stream import AgentReport, items, json_lines
from coding_agent_env.agents.spec import AgentFile, CliAgentSpec, Launch, LaunchContext, PipInstall, PipPackage

__all__ = ["MINI_SWE_AGENT", "parse_mini_events"]

VERSION = "2.4.6"
PACKAGE = "mini-swe-agent"
COMMAND_TIMEOUT_S = 600

SYSTEM = """You are a software engineer working in a Linux shell, in the directory that holds the task's files.
Use the `bash` tool to run commands: one command per call, each in a fresh subshell (cd and exported variables
do not persist). Inspect files, make the changes the task asks for, and check them by running them.
When you are done, run exactly `echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT` on its own; after it you cannot act."""

RUNNER = '''"""Runs mini-swe-agent on the instruction read from stdin (written by coding-agent-env)."""
import json
import os
import sys

from minisweagent.agents.default import DefaultAgent
from minisweagent.environments.local import LocalEnvironment
from minisweagent.models.litellm_model import LitellmModel


def main() -> int:
    task = sys.stdin.read()
    model = LitellmModel(
        model_name="openai/" + os.environ["CAE_MODEL"],
        model_kwargs={"api_base": os.environ["CAE_BASE_URL"], "drop_params": True},
        cost_tracking="ignore_errors",
    )
    env = LocalEnvironment(cwd=os.getcwd(), timeout=int(os.environ["CAE_COMMAND_TIMEOUT_S"]))
    agent = DefaultAgent(model, env, system_template=os.environ["CAE_SYSTEM"], instance_template="{{task}}",
                         step_limit=0, cost_limit=0)
    try:
        result = agent.run(task)
    finally:
        for message in agent.messages:
            print(json.dumps({"type": "message", "message": message}, default=str), flush=True)
    print(json.dumps({"type": "result", **result}, default=str), flush=True)
    return 0 if result.get("exit_status") == "Submitted" else 1


if __name__ == "__main__":
    sys.exit(main())
'''


def render(ctx: LaunchContext) -> Launch:
    runner = f"{ctx.agent_dir}/mini/runner.py"
    env = {
        "OPENAI_API_KEY": ctx.token,
        "CAE_BASE_URL": ctx.base_url,
        "CAE_MODEL": ctx.model,
        "CAE_SYSTEM": SYSTEM,
        "CAE_COMMAND_TIMEOUT_S": str(COMMAND_TIMEOUT_S),
        "MSWEA_CONFIGURED": "true",
        "MSWEA_GLOBAL_CONFIG_DIR": f"{ctx.agent_dir}/mini",
        "MSWEA_COST_TRACKING": "ignore_errors",
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",
        "LITELLM_TELEMETRY": "False",
        "PYTHONUNBUFFERED": "1",
        "PYTHONDONTWRITEBYTECODE": "1",
    }
    argv = (f"{ctx.prefix}/venv/bin/python", "-I", runner)
    return Launch(argv=argv, env=env, files=(AgentFile(runner, RUNNER, mode=0o644),))


def parse_mini_events(text: str) -> AgentReport:
    """Total: any text gives a report (see `events.json_lines` for the bounds)."""
    report = AgentReport()
    for event in json_lines(text, report):
        if event.get("type") == "result":
            status = event.get("exit_status")
            if status != "Submitted":
                report.add_error(status or "no exit status")
            continue
        message = event.get("message")
        if not isinstance(message, dict) or message.get("role") != "assistant":
            continue
        report.steps += 1
        report.add_text(message.get("content"))
        for call in items(message.get("tool_calls")):
            function = call.get("function") if isinstance(call, dict) else None
            if isinstance(function, dict):
                report.add_tool(function.get("name"), function.get("arguments"))
        report.tokens += _tokens(message)
    return report


def _tokens(message: dict[str, Any]) -> int:
    """The call's total tokens, from the response LiteLLM kept in the message's `extra`."""
    extra = message.get("extra")
    response = extra.get("response") if isinstance(extra, dict) else None
    usage = response.get("usage") if isinstance(response, dict) else None
    total = usage.get("total_tokens") if isinstance(usage, dict) else None
    return total if isinstance(total, int) and total > 0 else 0


MINI_SWE_AGENT = CliAgentSpec(
    name="mini-swe-agent",
    installs=(PipInstall((PipPackage(PACKAGE, VERSION),)),),
    render=render,
    parse_events=parse_mini_events,
)
