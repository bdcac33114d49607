"""A minimal LLM agent for pipeline tests: one chat call from inside the sandbox, answer written to a file.

It runs as a real process in the sandbox, gets the relay URL and token through its environment (as the CLI
agents do), and reads its prompt from the instruction file."""

from __future__ import annotations

from coding_agent_env.agents.base import Agent, AgentContext, run_in_sandbox

PROBE = r"""
import json, os, pathlib, sys, urllib.request
prompt = pathlib.Path(sys.argv[1]).read_text()
body = json.dumps({"model": os.environ["MODEL"], "messages": [{"role": "user", "content": prompt}], "stream": True,
                   "stream_options": {"include_usage": True}}).encode()
req = urllib.request.Request(os.environ["OPENAI_BASE_URL"] + "/chat/completions", data=body,
                             headers={"Authorization": "Bearer " + os.environ["OPENAI_API_KEY"], "Content-Type": "application/json"})
text = ""
for line in urllib.request.urlopen(req, timeout=20):
    line = line.decode().strip()
    if line.startswith("data: {"):
        for choice in json.loads(line[6:]).get("choices", []):
            text += choice.get("delta", {}).get("content") or ""
pathlib.Path("answer.txt").write_text(text)
seen = []  # what any process in the agent's sandbox could read: every environment and argv
for proc in pathlib.Path("/proc").glob("[0-9]*"):
    for part in ("environ", "cmdline"):
        try:
            seen.append((proc / part).read_bytes().replace(b"\0", b" ").decode(errors="replace"))
        except OSError:
            pass
# Its own token would be redacted from the result: name it, so any redaction left would be something else.
pathlib.Path("agent_view.txt").write_text("\n".join(seen).replace(os.environ["OPENAI_API_KEY"], "<token>"))
"""


class ProbeAgent(Agent):
    name = "probe"
    needs_llm = True

    async def run(self, ctx: AgentContext) -> int:
        assert ctx.llm is not None
        script = f"{ctx.agent_dir}/probe.py"
        await ctx.sandbox.write_text(script, PROBE)
        env = {"OPENAI_BASE_URL": ctx.llm.base_url, "OPENAI_API_KEY": ctx.llm.token, "MODEL": ctx.llm.model}
        return await run_in_sandbox(ctx, ["python3", script, ctx.instruction_path], env=env)
