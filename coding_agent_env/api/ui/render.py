"""Pure rendering for the web tab: events to log lines, a `RolloutResult` to badge, tables and summaries.

Nothing here imports gradio; every function takes wire models and returns strings or rows, so the contracts
are testable without a browser. HTML output escapes every value that came from a rollout.
"""

from __future__ import annotations

import html
import statistics

from coding_agent_env.models import CommandResult, RolloutResult, RolloutStatus
from coding_agent_env.rollout import events as ev

__all__ = [
    "COMMAND_COLUMNS",
    "Verdict",
    "badge_html",
    "command_rows",
    "event_line",
    "files_html",
    "message_html",
    "result_parts",
    "turns_markdown",
    "verdict",
]

COMMAND_COLUMNS = ["#", "command", "exit", "seconds", "timed out", "stdout", "stderr"]
_CELL_CHARS = 400
"""Characters of stdout/stderr shown per table cell; the raw JSON has the rest."""

_SCORED = (RolloutStatus.COMPLETED, RolloutStatus.AGENT_FAILED, RolloutStatus.AGENT_TIMEOUT)


class Verdict:
    PASS = "PASS"
    PARTIAL = "PARTIAL"
    FAIL = "FAIL"


_VERIFY_CONTEXT = {"workspace": "<b>the agent's workspace</b>", "clean_room": "<b>a clean room</b>"}


def verdict(result: RolloutResult) -> str:
    """PASS at reward 1.0, PARTIAL strictly between 0 and 1, FAIL otherwise (including a null reward)."""
    if result.reward is None or result.status not in _SCORED:
        return Verdict.FAIL
    if result.reward >= 1.0:
        return Verdict.PASS
    return Verdict.PARTIAL if result.reward > 0.0 else Verdict.FAIL


def badge_html(result: RolloutResult) -> str:
    """The verdict badge with reward, status, isolation, where verify ran and time; what a clean room did not
    take from the workspace; the error line when there is one."""
    word = verdict(result)
    reward = "null" if result.reward is None else f"{result.reward:.3g}"
    facts = [
        f"reward <b>{reward}</b>",
        f"status <b>{html.escape(result.status.value)}</b>",
        f"agent {html.escape(result.agent)}",
        f"sandbox {html.escape(result.sandbox)}",
        f"isolation <b>{html.escape(result.isolation or 'unknown')}</b>",
        f"network {html.escape(result.network or 'unknown')}",
        f"verify in {_VERIFY_CONTEXT.get(result.verify_context or '', 'no context (did not run)')}",
        f"{result.timings.total_s:.2f}s",
    ]
    parts = [
        f'<div class="cae-result" data-verdict="{word}">',
        f'<span class="cae-badge cae-{word.lower()}">{word}</span> ',
        " · ".join(facts),
    ]
    if result.reward_note:
        parts.append(f"<div>note: {html.escape(result.reward_note)}</div>")
    report = result.artifacts
    if report is not None and (report.missing or report.refused):
        left = [f"{path} (missing)" for path in report.missing]
        left += [f"{path} ({why})" for path, why in report.refused.items()]
        parts.append(f"<div>artifacts not taken: {html.escape('; '.join(left))}</div>")
    if result.error_detail is not None:
        err = result.error_detail
        what = f"{html.escape(err.stage)}: {html.escape(err.type)}: {html.escape(err.message)}"
        parts.append(f"<div>error in {what}</div>")
    parts.append("</div>")
    return "".join(parts)


def result_parts(result: RolloutResult) -> dict[str, object]:
    """A result as the tab shows it, by part: the badge (`notice`), the setup and verify rows, the files, the
    turns, the agent log and the raw JSON (`result_view.result_tabs` lays out all but the badge)."""
    return {
        "notice": badge_html(result),
        "setup": command_rows(result.setup_results),
        "verify": command_rows(result.verify_results),
        "files": files_html(result),
        "turns": turns_markdown(result),
        "agent_log": result.agent_log_tail,
        "raw": result.model_dump_json(indent=2),
    }


def message_html(text: str, *, kind: str = "error") -> str:
    """A banner for messages that are not a result (capacity full, an invalid form)."""
    return f'<div class="cae-message cae-{kind}">{html.escape(text)}</div>'


def _cell(text: str) -> str:
    return text if len(text) <= _CELL_CHARS else text[:_CELL_CHARS] + " …"


def command_rows(results: list[CommandResult]) -> list[list[object]]:
    """One row per command, in COMMAND_COLUMNS order."""
    return [
        [
            i, r.cmd, r.exit_code, round(r.duration_s, 3), r.timed_out,
            _cell(r.stdout), _cell(r.stderr),
        ]
        for i, r in enumerate(results)
    ]


def files_html(result: RolloutResult) -> str:
    """Each collected file as a collapsible block (open by default), then the omitted paths."""
    if not result.files and not result.files_extra:
        return "<p><i>no files collected</i></p>"
    blocks = [
        f'<details open class="cae-file"><summary><code>{html.escape(path)}</code></summary>'
        f"<pre>{html.escape(text)}</pre></details>"
        for path, text in sorted(result.files.items())
    ]
    if result.files_extra:
        omitted = ", ".join(html.escape(p) for p in result.files_extra)
        blocks.append(f"<p>omitted (over the collection caps): {omitted}</p>")
    return "".join(blocks)


def turns_markdown(result: RolloutResult) -> str:
    """Count, tokens and (when present) a logprob summary of the recorded LLM turns."""
    turns = result.proxy_turns
    if not turns:
        return "No LLM turns recorded (the oracle and nop agents make none)."
    prompt = sum(t.usage.prompt_tokens or 0 for t in turns if t.usage)
    completion = sum(t.usage.completion_tokens or 0 for t in turns if t.usage)
    errors = sum(1 for t in turns if t.error)
    lines = [
        f"**{len(turns)} turns** · prompt tokens {prompt} · completion tokens {completion} · "
        f"upstream errors {errors} · LLM time {sum(t.latency_s for t in turns):.2f}s",
    ]
    logprobs = [lp for t in turns for lp in t.per_token_logps]
    if logprobs:
        lines.append(
            f"logprobs: {len(logprobs)} tokens · mean {statistics.fmean(logprobs):.3f} · min {min(logprobs):.3f}"
        )
    tools = [c.name or "?" for t in turns for c in t.message.tool_calls]
    if tools:
        lines.append("tool calls: " + ", ".join(f"`{name}`" for name in tools[:50]))
    return "\n\n".join(lines)


def event_line(event: ev.RolloutEvent, elapsed_s: float) -> str:
    """One human-readable line of the live phase log."""
    stamp = f"[{elapsed_s:7.2f}s] "
    match event:
        case ev.RolloutStarted():
            text = f"rollout {event.rollout_id[:12]} started: agent {event.agent}, sandbox {event.sandbox}"
        case ev.PhaseStarted():
            text = f"{event.phase} ..."
        case ev.PhaseFinished():
            text = f"{event.phase} done in {event.duration_s:.2f}s"
        case ev.Provisioned():
            text = f"sandbox {event.sandbox_id} ready (isolation: {event.isolation})"
        case ev.CommandFinished():
            r = event.result
            outcome = "timed out" if r.timed_out else f"exit {r.exit_code}"
            text = f"{event.phase}[{event.index}] {outcome} in {r.duration_s:.2f}s: {_first_line(r.cmd)}"
        case ev.AgentFinished():
            text = "agent timed out" if event.timed_out else f"agent exited with {event.exit_code}"
        case ev.RolloutFinished():
            text = f"finished: {event.status.value}, reward {event.reward}"
        case _:
            text = event.type
    return stamp + text


def _first_line(cmd: str, limit: int = 120) -> str:
    line = cmd.strip().splitlines()[0] if cmd.strip() else ""
    return line if len(line) <= limit else line[:limit] + " …"
