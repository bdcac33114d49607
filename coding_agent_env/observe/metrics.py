"""What one server does, as Prometheus metrics (`prometheus_client`): `ServerMetrics`, served at `GET /metrics`.

Contract:
- Each `ServerMetrics` owns its own `CollectorRegistry` (never the process-wide default one: a process may build
  many apps, tests do), and `exposition()` renders it in the text format (`CONTENT_TYPE_LATEST`).
- Names follow Prometheus's conventions: the `coding_agent_env_` prefix, counters end in `_total`, durations are
  `_seconds` histograms, base units only.
- Label values come from closed sets fixed when the metrics are built (statuses, phases, the server's agents,
  backends and task splits, limit kinds, engines, dialects, HTTP status classes); anything outside its set is
  `other`. No id (task, rollout, episode, session) and no free text is ever a label value, so the number of
  series is bounded whatever clients send, and nothing a request carries (a key, a prompt) reaches the output.
- Live figures (sessions by kind, episodes, capacity) are read at scrape time from a `LiveCounts` source; the
  rest is counted as things finish: a rollout's phases, reward, limits, sandbox and LLM calls from its
  `RolloutResult` when it ends (so relay calls appear when their rollout finishes, not as they happen).
- Recording never raises into the caller's work: callers may rely on that (a bad value is logged and dropped).

Imports only `prometheus_client` and the wire models (layering: tests/unit/test_layers.py).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import get_args

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from coding_agent_env.models import AGENT_NAMES, RolloutResult, RolloutStatus, Turn
from coding_agent_env.models.common import NativeDialect
from coding_agent_env.models.results import LIMIT_KINDS, limit_kind
from coding_agent_env.models.results import PHASES as ROLLOUT_PHASES

__all__ = [
    "ADHOC",
    "CONTENT_TYPE_LATEST",
    "ENGINES",
    "EPISODE_CALLS",
    "EPISODE_STATUSES",
    "LIMIT_KINDS",
    "OTHER",
    "PHASES",
    "STATUS_CLASSES",
    "LiveCounts",
    "ServerMetrics",
    "limit_kind",
    "status_class",
]

log = logging.getLogger(__name__)

PREFIX = "coding_agent_env_"
OTHER = "other"
"""The label value of anything outside its closed set."""
ADHOC = "adhoc"
"""The task-set label of a rollout that named no task of the server's set."""
PHASES = (*ROLLOUT_PHASES, "total")
"""`RolloutResult.timings` fields (without `_s`)."""
STATUS_CLASSES = ("2xx", "4xx", "5xx", "error")
"""An LLM call's outcome: the upstream's status class, or `error` (no answer: unreachable, timed out, cut, or a
status outside 2xx/4xx/5xx)."""
ENGINES = ("vllm", "sglang", "llamacpp", "openai", "unknown")
"""`Turn.engine` values; `unknown` when the turn names none."""
DIALECTS = ("chat", *get_args(NativeDialect))
"""How a call went upstream: `chat` (chat completions) or the native dialect it passed through in."""
EPISODE_STATUSES = ("completed", "setup_failed", "infra_error", "expired", "cancelled")
"""How an episode can end (`episode.report.EpisodeStatus` without `running`)."""
EPISODE_CALLS = ("terminal", "keystrokes", "final_answer")
"""An episode's calls: a `terminal` command, `keystrokes`, and the `terminal` call carrying the final answer."""
IMAGE_BUILD_OUTCOMES = ("built", "present", "disabled", "no_docker", "too_large", "bad_context", "build_failed",
                        "error", OTHER)
SESSION_KINDS = ("ws", "http", "mcp", "ui")

_PHASE_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0)
_LLM_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0)
_CALL_BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)
_REWARD_BUCKETS = (0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0)

@dataclass(frozen=True)
class LiveCounts:
    """What the server holds now: sessions by kind, live interactive episodes, the session capacity, and the
    groups' set-up templates (held, of which idle, and the bytes of their writable layers)."""

    sessions: Mapping[str, int] = field(default_factory=dict)
    episodes: int = 0
    capacity: int = 0
    templates: int = 0
    templates_idle: int = 0
    template_bytes: int = 0


def status_class(status: int | None) -> str:
    """`2xx` / `4xx` / `5xx` for an upstream's answer, `error` when there was none (or it was none of those)."""
    if status is not None and 200 <= status < 300:
        return "2xx"
    if status is not None and 400 <= status < 600:
        return f"{status // 100}xx"
    return "error"


def _closed(value: str | None, allowed: Iterable[str]) -> str:
    return value if value is not None and value in allowed else OTHER


class _LiveCollector(Collector):
    """The gauges read at scrape time from `read()` (on the scraping thread: the server's event loop)."""

    def __init__(self, read: Callable[[], LiveCounts] | None) -> None:
        self.read = read

    def collect(self) -> Iterator[Metric]:
        counts = self.read() if self.read is not None else LiveCounts()
        sessions = GaugeMetricFamily(f"{PREFIX}sessions_live", "Sessions alive now, by the door that made them.",
                                     labels=["kind"])
        seen = {kind: 0 for kind in SESSION_KINDS}
        for kind, count in counts.sessions.items():
            key = _closed(kind, SESSION_KINDS)
            seen[key] = seen.get(key, 0) + count
        for kind, count in seen.items():
            sessions.add_metric([kind], count)
        yield sessions
        yield GaugeMetricFamily(f"{PREFIX}episodes_live", "Interactive episodes taking calls now.",
                                value=counts.episodes)
        yield GaugeMetricFamily(f"{PREFIX}sessions_capacity", "Sessions the server holds at once "
                                "(MAX_CONCURRENT_ENVS).", value=counts.capacity)
        templates = GaugeMetricFamily(f"{PREFIX}group_templates", "Group set-up templates held now (at most "
                                      "GROUP_MAX_TEMPLATES), by whether a member holds them.", labels=["state"])
        templates.add_metric(["in_use"], counts.templates - counts.templates_idle)
        templates.add_metric(["idle"], counts.templates_idle)
        yield templates
        yield GaugeMetricFamily(f"{PREFIX}group_template_bytes", "Bytes the group templates' writable layers hold "
                                "now (budget: GROUP_TEMPLATE_BUDGET_MB).", value=counts.template_bytes)


class ServerMetrics:
    """One server's metrics, in a registry of their own. See the module docstring."""

    def __init__(self, *, backends: Iterable[str] = (), task_sets: Iterable[str] = (),
                 agents: Iterable[str] = AGENT_NAMES) -> None:
        """`backends`, `task_sets`, `agents`: the closed sets of those labels (the server's enabled sandbox
        backends, its task set's splits, the agents a request may name); other values are counted as `other`."""
        self.registry = CollectorRegistry(auto_describe=True)
        self.agents = frozenset(agents)
        self.backends = frozenset(backends)
        self.task_sets = frozenset(task_sets) | {ADHOC}
        self._live = _LiveCollector(None)
        self.registry.register(self._live)
        r = self.registry
        self.rollouts = Counter(f"{PREFIX}rollouts_finished", "Rollouts finished, by status, agent and sandbox "
                                "backend.", ["status", "agent", "backend"], registry=r)
        self.phase_seconds = Histogram(f"{PREFIX}rollout_phase_seconds", "Time of each rollout phase (its "
                                       "result's timings; a phase that did not run counts 0), and the whole rollout "
                                       "(`total`).", ["phase"], buckets=_PHASE_BUCKETS, registry=r)
        self.reward = Histogram(f"{PREFIX}rollout_reward", "Rewards of scored rollouts, by task set (the split of "
                                "the server's task set the rollout's task_id names, else `adhoc`).", ["task_set"],
                                buckets=_REWARD_BUCKETS, registry=r)
        self.limits_hit = Counter(f"{PREFIX}limits_hit", "Sandbox-wide limits rollouts ran into, by kind.",
                                  ["kind"], registry=r)
        self.sandboxes = Counter(f"{PREFIX}sandbox_creations", "Sandboxes rollouts made, by backend.",
                                 ["backend"], registry=r)
        self.sandbox_failures = Counter(f"{PREFIX}sandbox_creation_failures", "Rollouts whose sandbox could not be "
                                        "made (an infrastructure error at provision), by backend.", ["backend"],
                                        registry=r)
        self.relay_calls = Counter(f"{PREFIX}relay_calls", "LLM calls the relay made for finished rollouts, by the "
                                   "dialect sent upstream, the engine and the answer's status class.",
                                   ["dialect", "engine", "status_class"], registry=r)
        self.relay_seconds = Histogram(f"{PREFIX}relay_call_seconds", "Latency of those LLM calls.",
                                       ["dialect", "engine"], buckets=_LLM_BUCKETS, registry=r)
        self.tokens_in = Counter(f"{PREFIX}relay_prompt_tokens", "Prompt tokens of those LLM calls (the upstream's "
                                 "usage, else the prompt token ids).", ["engine"], registry=r)
        self.tokens_out = Counter(f"{PREFIX}relay_completion_tokens", "Completion tokens of those LLM calls (the "
                                  "upstream's usage, else the sampled token ids).", ["engine"], registry=r)
        self.group_members = Counter(f"{PREFIX}group_members", "Finished rollouts that were members of a group "
                                     "(`group_id`), by how they got their set-up state (`forked` from the group's "
                                     "template, or `per_member`) and whether their start made the template.",
                                     ["setup", "made_template"], registry=r)
        self.group_forks = Histogram(f"{PREFIX}group_fork_seconds", "Time to fork a group member's sandbox from its "
                                     "template.", buckets=_CALL_BUCKETS, registry=r)
        self.episodes = Counter(f"{PREFIX}episodes_finished", "Interactive episodes ended, by status.",
                                ["status"], registry=r)
        self.episode_calls = Counter(f"{PREFIX}episode_calls", "Calls into interactive episodes (terminal "
                                     "commands, keystrokes, final answers).", ["call"], registry=r)
        self.episode_failures = Counter(f"{PREFIX}episode_call_failures", "Episode calls that failed (refused, "
                                        "or the episode ended under them).", ["call"], registry=r)
        self.episode_seconds = Histogram(f"{PREFIX}episode_call_seconds", "Time of each episode call.", ["call"],
                                         buckets=_CALL_BUCKETS, registry=r)
        self.task_api = Counter(f"{PREFIX}task_api_requests", "Task API requests, by route and HTTP status code.",
                                ["route", "code"], registry=r)
        self.image_builds = Counter(f"{PREFIX}image_build_requests", "`POST /images` requests, by outcome.",
                                    ["outcome"], registry=r)

    # -- sources ---------------------------------------------------------------------------------------

    def watch(self, read: Callable[[], LiveCounts]) -> None:
        """Read the live gauges from `read()` at each scrape (it runs where the scrape does: keep it cheap)."""
        self._live.read = read

    def exposition(self) -> bytes:
        """Every metric in Prometheus's text format (`CONTENT_TYPE_LATEST`)."""
        return generate_latest(self.registry)

    # -- rollouts --------------------------------------------------------------------------------------

    def rollout_finished(self, result: RolloutResult, task_set: str | None = None) -> None:
        """Count a finished rollout: status, phases, reward, limits, its sandbox and its LLM calls. `task_set`: the
        split of the server's task set it ran a task of (None: `adhoc`)."""
        try:
            self._rollout(result, task_set)
        except Exception:  # metrics never cost the caller its result
            log.exception("metrics: counting rollout %s failed", result.rollout_id)

    def _rollout(self, result: RolloutResult, task_set: str | None) -> None:
        backend = _closed(result.sandbox, self.backends)
        status = _closed(result.status.value, [s.value for s in RolloutStatus])
        self.rollouts.labels(status, _closed(result.agent, self.agents), backend).inc()
        for phase in PHASES:
            self.phase_seconds.labels(phase).observe(max(0.0, getattr(result.timings, f"{phase}_s")))
        if result.reward is not None:
            self.reward.labels(_closed(task_set or ADHOC, self.task_sets)).observe(result.reward)
        for text in result.limits_hit:
            self.limits_hit.labels(limit_kind(text)).inc()
        if result.sandbox_id:
            self.sandboxes.labels(backend).inc()
        detail = result.error_detail
        if result.status is RolloutStatus.INFRA_ERROR and detail is not None and detail.stage == "provision":
            self.sandbox_failures.labels(backend).inc()
        for turn in result.proxy_turns:
            self._relay_call(turn)
        group = result.group
        if group is not None:
            self.group_members.labels(group.setup, "true" if group.made_here else "false").inc()
            if group.fork_s is not None:
                self.group_forks.observe(max(0.0, group.fork_s))

    def _relay_call(self, turn: Turn) -> None:
        dialect = _closed(turn.passthrough or "chat", DIALECTS)
        engine = _closed(turn.engine or "unknown", ENGINES)
        self.relay_calls.labels(dialect, engine, status_class(turn.upstream_status)).inc()
        self.relay_seconds.labels(dialect, engine).observe(max(0.0, turn.latency_s))
        usage = turn.usage
        prompt = usage.prompt_tokens if usage is not None and usage.prompt_tokens is not None else \
            len(turn.prompt_token_ids or ())
        completion = usage.completion_tokens if usage is not None and usage.completion_tokens is not None else \
            len(turn.completion_token_ids)
        self.tokens_in.labels(engine).inc(max(0, prompt))
        self.tokens_out.labels(engine).inc(max(0, completion))

    # -- episodes --------------------------------------------------------------------------------------

    def episode_finished(self, status: str) -> None:
        """Count an episode that ended with `status` (an `EpisodeStatus` value)."""
        self.episodes.labels(_closed(status, EPISODE_STATUSES)).inc()

    def episode_call(self, call: str, seconds: float, *, failed: bool) -> None:
        """Count one episode call (`terminal`, `keystrokes`, `final_answer`) that took `seconds`."""
        label = _closed(call, EPISODE_CALLS)
        self.episode_calls.labels(label).inc()
        if failed:
            self.episode_failures.labels(label).inc()
        self.episode_seconds.labels(label).observe(max(0.0, seconds))

    # -- HTTP routes -----------------------------------------------------------------------------------

    def task_api_request(self, route: str, code: int) -> None:
        """Count a Task API request: `route` is the route's path template (a closed set), `code` its status."""
        self.task_api.labels(route, str(code) if 100 <= code < 600 else OTHER).inc()

    def image_build(self, outcome: str) -> None:
        """Count a `POST /images` request by outcome (`IMAGE_BUILD_OUTCOMES`)."""
        self.image_builds.labels(_closed(outcome, IMAGE_BUILD_OUTCOMES)).inc()
