"""What a CLI agent's JSON event stream says happened, and a bounded, total JSON-lines reader.

`AgentReport` is the agent-independent summary every spec's parser returns. `json_lines` never raises:
oversized lines, too-deep nesting and invalid JSON are counted as malformed and skipped. Parsers look inside
events only through type checks (`items` for what they iterate); `parse_total` is the driver's last line of
defence: a parser that raises anyway gives a report that says so, never an exception out of a rollout.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from coding_agent_env import jsonsafe
from coding_agent_env.models import AgentEvents, AgentToolUse

__all__ = [
    "AgentReport", "items", "json_lines", "parse_total", "render_transcript", "report_events",
]

MAX_LINE_CHARS = 4 * 1024 * 1024
"""Longest event line parsed; longer ones are malformed."""
MAX_DEPTH = 64
"""Deepest JSON nesting parsed; deeper lines are malformed (json would recurse without bound)."""
MAX_ITEMS = 10_000
"""Most tool calls, texts or errors kept in a report."""
MAX_TEXT_CHARS = 4000
"""Characters kept of each text, error or tool input."""


@dataclass
class AgentReport:
    """Summary of one agent run, from its events."""

    events: int = 0
    steps: int = 0
    tool_calls: list[tuple[str, str]] = field(default_factory=list)
    """(tool name, its input rendered short)."""
    texts: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    malformed: int = 0
    tokens: int = 0

    def add_tool(self, name: Any, detail: Any) -> None:
        if len(self.tool_calls) < MAX_ITEMS:
            self.tool_calls.append((_short(name, 100), _short(detail, MAX_TEXT_CHARS)))

    def add_text(self, text: Any) -> None:
        if isinstance(text, str) and text.strip() and len(self.texts) < MAX_ITEMS:
            self.texts.append(_short(text, MAX_TEXT_CHARS))

    def add_error(self, error: Any) -> None:
        if len(self.errors) < MAX_ITEMS:
            self.errors.append(_short(error, MAX_TEXT_CHARS))

    def summary(self, agent: str) -> str:
        tools = ", ".join(sorted({name for name, _ in self.tool_calls})) or "none"
        return (
            f"{agent}: {self.events} events, {self.steps} steps, {len(self.tool_calls)} tool calls ({tools}), "
            f"{len(self.errors)} errors, {self.malformed} malformed lines"
        )


def _short(value: Any, limit: int) -> str:
    if not isinstance(value, str):
        try:
            value = json.dumps(value, ensure_ascii=False, default=str)
        except (TypeError, ValueError, RecursionError):
            value = repr(type(value))
    return value if len(value) <= limit else value[:limit] + "..."


def json_lines(text: str, report: AgentReport) -> Iterator[dict[str, Any]]:
    """The JSON objects among the lines of `text`; everything else that looks like JSON counts as malformed."""
    for line in text.splitlines():
        line = line.strip()
        if not line.startswith("{"):
            continue
        try:
            value = jsonsafe.loads(line, max_chars=MAX_LINE_CHARS, max_depth=MAX_DEPTH)
        except ValueError:
            report.malformed += 1
            continue
        if isinstance(value, dict):
            report.events += 1
            yield value
        else:
            report.malformed += 1


def items(value: Any) -> list[Any]:
    """`value` if it is a list, else nothing: an event's field iterated over may hold anything (a number, a
    string, an object)."""
    return value if isinstance(value, list) else []


def parse_total(parse: Callable[[str], AgentReport], text: str) -> AgentReport:
    """`parse(text)`, or, should it raise, an empty report whose error and malformed count say so. Events are
    the agent's (sandbox) output: nothing in them may raise out of a rollout."""
    try:
        return parse(text)
    except Exception as exc:  # noqa: BLE001 - the contract: a report, whatever the events hold
        report = AgentReport(malformed=1)
        report.add_error(f"events not parsed: {type(exc).__name__}")
        return report


def render_transcript(report: AgentReport, agent: str) -> str:
    """A human-readable transcript of the report for the agent log (its tail lands in the result)."""
    lines = [f"[coding-agent-env] {report.summary(agent)}"]
    lines += [f"[tool] {name}: {detail[:300]}" for name, detail in report.tool_calls[-50:]]
    lines += [f"[text] {text[:500]}" for text in report.texts[-10:]]
    lines += [f"[error] {error[:500]}" for error in report.errors[-10:]]
    return "\n".join(lines) + "\n"


def report_events(report: AgentReport) -> AgentEvents:
    """The report as the result's `agent_events`."""
    return AgentEvents(
        events=report.events,
        steps=report.steps,
        tool_calls=[AgentToolUse(name=name, input=detail) for name, detail in report.tool_calls],
        texts=report.texts,
        errors=report.errors,
        malformed=report.malformed,
        tokens=report.tokens,
    )
