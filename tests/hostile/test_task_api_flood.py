"""A Task API flood (issue 42 item 4, INTEGRITY rule 41: bounded work per request on the event loop).

A live server with a 100,000-task split (about 27 MB as the Task API's JSON), and `CLIENTS` clients asking for
the whole split at once, `ROUNDS` times each. On main the list was built and serialised on the event loop:
`/health` took up to 2 s and the watchdog counted 21 stalls. Now each answer is streamed, serialised a chunk
at a time off the loop: `/health` answers within `HEALTH_WORST_S` throughout (probed every 0.1 s from another
thread), the watchdog counts no stall (the loop held half a second, the hostile suite's threshold), and every
client still gets every task, in order, as openenv 0.10's clients expect.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from tests.hostile.server import HealthProbe, HostileServer

SPLIT_TASKS = 100_000
CLIENTS = 6
ROUNDS = 2
HEALTH_WORST_S = 1.0
INSTRUCTION = "Fix the failing test in the repository so that the whole suite passes again. " * 3
"""About 240 characters: the size of a typical task's public view, as in the split measured on main."""
ENV = "coding_agent_env"


@pytest.fixture(scope="module")
def flood_server() -> Iterator[HostileServer]:
    parent = Path(tempfile.mkdtemp(prefix="cae-hostile-flood-"))
    os.chmod(parent, 0o711)
    state = parent / "state"
    state.mkdir(mode=0o711)
    tasks = parent / "big.jsonl"
    with tasks.open("w") as out:
        for i in range(SPLIT_TASKS):
            out.write(json.dumps({"instruction": f"{INSTRUCTION}(task {i})", "verify": ["true"],
                                  "task_id": f"big-{i}"}) + "\n")
    server = HostileServer(state, args=("--tasks", f"big={tasks}"))
    try:
        yield server
    finally:
        stopped = server.stop()
        log = server.log_text()
        subprocess.run(["rm", "-rf", "--one-file-system", str(parent)], check=False)
        assert stopped, f"the server ignored SIGTERM (needed SIGKILL): {log[-2000:]}"


CLIENT = """
import json, sys, httpx
answer = httpx.post(sys.argv[1], json={"split": "big"}, timeout=120)
answer.raise_for_status()
tasks = answer.json()["tasks"]
print(json.dumps([len(tasks), len(answer.content), [t["index"] for t in tasks] == list(range(len(tasks)))]))
"""
"""One client, in a process of its own: parsing 27 MB holds an interpreter's lock for a while, and the probe's
thread must not wait on it (that would be the test's delay, not the server's)."""


def _whole_split(url: str) -> tuple[int, int, bool]:
    """(tasks, bytes, indices in order) of one `/tasks` answer for the big split."""
    done = subprocess.run([sys.executable, "-c", CLIENT, f"{url}/{ENV}/tasks"], capture_output=True, text=True,
                          timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    count, size, ordered = json.loads(done.stdout)
    return count, size, ordered


def test_a_flood_of_whole_split_lists_leaves_the_loop_free(flood_server: HostileServer) -> None:
    stalls_before = flood_server.loop_stats()["stalls"]
    with HealthProbe(flood_server.http) as probe, ThreadPoolExecutor(CLIENTS) as pool:
        answers = list(pool.map(_whole_split, [flood_server.http] * (CLIENTS * ROUNDS)))
    assert all(count == SPLIT_TASKS and ordered for count, _, ordered in answers), answers[:3]
    assert min(size for _, size, _ in answers) > 20_000_000  # the answer really is large
    assert probe.answers > 0 and not probe.failures, probe.failures
    assert probe.worst_s < HEALTH_WORST_S, f"/health took {probe.worst_s:.2f} s during the flood"
    stats = flood_server.loop_stats()
    print(f"flood: {CLIENTS * ROUNDS} answers of {answers[0][1] / 1e6:.1f} MB; /health worst {probe.worst_s * 1000:.0f}"
          f" ms over {probe.answers} probes; loop lag max {stats['lag_max_ms']:.0f} ms, "
          f"stalls {stats['stalls'] - stalls_before}")
    assert stats["stalls"] == stalls_before, f"the event loop stalled: {stats['last_stall']}"


def test_pages_walk_the_big_split(flood_server: HostileServer) -> None:
    """Paged (`limit`, `next_cursor`), the same split comes back in bounded answers, every task once."""
    seen, cursor, pages = 0, None, 0
    with httpx.Client(base_url=flood_server.http, timeout=60) as client:
        while True:
            body = {"split": "big", "limit": 10_000, **({"cursor": cursor} if cursor else {})}
            page = client.post(f"/{ENV}/tasks", json=body).json()
            assert [task["index"] for task in page["tasks"]] == list(range(seen, seen + len(page["tasks"])))
            seen, cursor, pages = seen + len(page["tasks"]), page["next_cursor"], pages + 1
            if cursor is None:
                break
    assert (seen, pages) == (SPLIT_TASKS, SPLIT_TASKS // 10_000)
