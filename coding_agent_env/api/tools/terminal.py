"""`terminal`: one command in the session's interactive episode, or the final answer that ends and scores it.

Offered while the session's episode lives. Its arguments are validated by `episode.parse_terminal` (exactly one
of `command` and `final_answer`); a command's result is a `TerminalResult`, a final answer's the episode's
`EpisodeReport` (with its reward, `done`). Its text states the result for clients that read only text: the
command's output and how it ended; for a final answer the outcome (passed/total and the reward, as upstream's
terminus_env says it).
"""

from __future__ import annotations

from typing import Any

from coding_agent_env.api.tools.base import Tool
from coding_agent_env.api.tools.reply import ToolReply
from coding_agent_env.episode import EpisodeReport, TerminalCall, TerminalResult, parse_terminal
from coding_agent_env.episode.terminal import TERMINAL_DESCRIPTION, TERMINAL_SCHEMA, TERMINAL_TOOL
from coding_agent_env.session import Session

__all__ = ["TERMINAL_TOOL", "Terminal", "command_text", "final_text"]


class Terminal(Tool[TerminalCall]):
    name = TERMINAL_TOOL
    description = TERMINAL_DESCRIPTION

    def schema(self) -> dict[str, Any]:
        return TERMINAL_SCHEMA

    def validate(self, arguments: Any) -> TerminalCall:
        return parse_terminal(arguments)

    def offered(self, live_episode: bool) -> bool:
        return live_episode

    async def run(self, session: Session, arguments: TerminalCall) -> ToolReply:
        outcome = await session.terminal(arguments)
        if isinstance(outcome, TerminalResult):
            return ToolReply.of(outcome, text=command_text(outcome))
        return ToolReply.of(outcome, text=final_text(outcome), reward=outcome.reward, done=True)


def command_text(result: TerminalResult) -> str:
    """The output, then on a line of its own how the command ended."""
    if result.note is not None:
        end = f"[{result.note}]" if result.exit_code is None else f"[exit code {result.exit_code}; {result.note}]"
    elif result.timed_out:
        end = "[timed out: the command and its processes were killed]"
    else:
        end = f"[exit code {result.exit_code}]"
    separator = "\n" if result.output and not result.output.endswith("\n") else ""
    return f"{result.output}{separator}{end}"


def final_text(report: EpisodeReport) -> str:
    """How the episode ended: verify's passed/total and the reward (and the error, if any)."""
    passed = sum(1 for r in report.verify_results if r.ok)
    reward = "none (not scored)" if report.reward is None else f"{report.reward:g}"
    total = len(report.verify_results)
    text = f"Episode {report.status.value}: {passed}/{total} verify commands passed; reward {reward}"
    if report.error is not None:
        text += f" ({report.error.type}: {report.error.message})"
    return text
