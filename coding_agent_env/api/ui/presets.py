"""Tasks the web tab offers as presets: each a `models.Task` (so every task field a preset may set is declared
there once, with its validation), plus the name the tab lists it under and a line saying what it shows.

Each preset carries its reference `solution`, so the `oracle` agent scores it without an LLM:
`binary_search` and `fizzbuzz` pass (reward 1.0); `failing` has a wrong solution and fails (reward 0.0).
Each declares its `artifacts`, so verify runs in a clean room. The two that run the agent's code verify it with
a hidden checker (`verify_files`, run as `python3 -I`) that runs the artifact in a child process and judges
only its answers: an artifact that exits at import, patches unittest or writes the reward file scores 0
(docs/concepts/integrity.md). `binary_search`'s checker is the bundled example's
(examples/binary_search.yaml), verbatim; `failing` runs no code of the agent's.
The tab shows a preset's task in its editors and builds the request from what the editors hold (`form`); the
Interactive tab starts an episode from the preset's task fields an episode takes (`task_fields`).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from pydantic import ConfigDict, Field

from coding_agent_env.models import Task
from coding_agent_env.tasks.catalog import TaskCatalog

__all__ = ["PRESETS", "Preset", "with_task_set"]

_PRESET_ONLY = frozenset({"name", "description"})


class Preset(Task):
    """A task the tab offers: the `Task` itself, with its listing name and what it shows (neither is a task
    field: `task_fields` leaves them out)."""

    model_config = ConfigDict(frozen=True)

    name: str = Field(min_length=1, description="The name the tab lists the preset under.")
    description: str = Field(default="", description="What the preset shows, in one line.")

    def task_fields(self, names: Iterable[str] | None = None) -> dict[str, Any]:
        """The task fields this preset sets (of `names`, default every `Task` field), as `Task` arguments."""
        wanted = set(Task.model_fields) if names is None else set(names) & set(Task.model_fields)
        chosen = wanted & self.model_fields_set
        return {name: getattr(self, name) for name in Task.model_fields if name in chosen}


_SEARCH_TEST = """\
import unittest
from search import binary_search


class TestBinarySearch(unittest.TestCase):
    def test_found(self):
        items = list(range(0, 1000, 3))
        for i, x in enumerate(items):
            self.assertEqual(binary_search(items, x), i)

    def test_absent(self):
        self.assertEqual(binary_search([1, 3, 5], 4), -1)
        self.assertEqual(binary_search([], 1), -1)


if __name__ == "__main__":
    unittest.main()
"""

_SEARCH_SOLUTION = """\
cat > search.py <<'PY'
def binary_search(items, target):
    lo, hi = 0, len(items) - 1
    while lo <= hi:
        mid = (lo + hi) // 2
        if items[mid] == target:
            return mid
        if items[mid] < target:
            lo = mid + 1
        else:
            hi = mid - 1
    return -1
PY"""

_FIZZBUZZ_SOLUTION = """\
cat > fizzbuzz.py <<'PY'
for i in range(1, 101):
    print("FizzBuzz" if i % 15 == 0 else "Fizz" if i % 3 == 0 else "Buzz" if i % 5 == 0 else i)
PY"""

_FIZZBUZZ_CHECK = """\
# Checks fizzbuzz.py by its output, trusting nothing fizzbuzz.py can do.
#
# Run as `python3 -I check_fizzbuzz.py N`: fizzbuzz.py runs in a child process and only its first N lines of
# output count, compared here with the expected ones (two commands, N = 15 and N = 100, give partial credit).
# This process is made non-dumpable first, so the child cannot ptrace it.
import ctypes
import os
import subprocess
import sys

PR_SET_DUMPABLE = 4


def main():
    if ctypes.CDLL(None, use_errno=True).prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) != 0:
        sys.exit("cannot make the checker non-dumpable")
    count = int(sys.argv[1])
    want = ["FizzBuzz" if i % 15 == 0 else "Fizz" if i % 3 == 0 else "Buzz" if i % 5 == 0 else str(i)
            for i in range(1, count + 1)]
    env = {k: v for k, v in os.environ.items() if k != "REWARD_FILE"}
    try:
        child = subprocess.run([sys.executable, "-I", "fizzbuzz.py"], capture_output=True, text=True, timeout=60,
                               env=env)
    except subprocess.TimeoutExpired:
        sys.exit("fizzbuzz.py: no output within 60 s")
    got = child.stdout.split()[:count]
    right = sum(a == b for a, b in zip(got, want))
    print(f"fizzbuzz.py: {right}/{count} of the first lines right")
    sys.exit(0 if got == want else 1)


main()
"""

_SEARCH_CHECK = """\
# Checks `binary_search` in search.py by its answers, trusting nothing search.py can do.
#
# Run as `python3 -I check_search.py` (isolated: nothing from the workdir or the environment is imported here).
# search.py is imported only in a child process, which reads the cases on stdin and prints its answers as one
# JSON line. The cases are new random ones each run and their answers are computed here, so exiting at import
# (os._exit(0), sys.exit(0)), patching unittest, printing a forged report or killing this process all fail:
# only right answers pass. This process is made non-dumpable first, so the child cannot ptrace it.
import bisect
import ctypes
import json
import os
import random
import subprocess
import sys

PR_SET_DUMPABLE = 4
CHILD = '''import json, os, sys
sys.path.append(os.getcwd())
from search import binary_search
cases = json.load(sys.stdin)
print(json.dumps([binary_search(items, target) for items, target in cases]))
'''


def cases(rng):
    out = [([], 1), ([5], 5), ([5], 4), ([1, 3, 5], 4), ([1, 3, 5], 6), ([1, 3, 5], 0)]
    for size in (2, 3, 10, 100, 1000):
        items = sorted(rng.sample(range(-10 * size, 10 * size), size))
        out += [(items, items[0]), (items, items[-1]), (items, rng.choice(items))]
        out += [(items, items[0] - 1), (items, items[-1] + 1), (items, rng.randrange(-10 * size, 10 * size))]
    return out


def expected(items, target):
    i = bisect.bisect_left(items, target)
    return i if i < len(items) and items[i] == target else -1


def main():
    if ctypes.CDLL(None, use_errno=True).prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) != 0:
        sys.exit("cannot make the checker non-dumpable")
    todo = cases(random.SystemRandom())
    env = {k: v for k, v in os.environ.items() if k != "REWARD_FILE"}
    try:
        child = subprocess.run([sys.executable, "-I", "-c", CHILD], input=json.dumps(todo), capture_output=True,
                               text=True, timeout=60, env=env)
    except subprocess.TimeoutExpired:
        sys.exit("binary_search: no answer within 60 s")
    lines = child.stdout.strip().splitlines()
    try:
        answers = json.loads(lines[-1]) if lines else None
    except ValueError:
        answers = None
    if not isinstance(answers, list) or len(answers) != len(todo):
        sys.exit(f"binary_search: no answers (exit code {child.returncode}): {child.stderr[-2000:]}")
    right = sum(answer == expected(items, target) for answer, (items, target) in zip(answers, todo))
    print(f"binary_search: {right}/{len(todo)} cases right")
    sys.exit(0 if right == len(todo) else 1)


main()
"""

PRESETS: dict[str, Preset] = {preset.name: preset for preset in (
    Preset(
        name="binary_search",
        description="Passes with its reference solution (reward 1.0); checked by the bundled example's checker.",
        instruction="Implement `binary_search(items, target)` in `search.py`: return the index of `target` in "
        "the sorted list `items`, or -1 if it is absent. Run `python3 -m unittest test_search` to check.",
        files={
            "search.py": "def binary_search(items, target):\n    raise NotImplementedError\n",
            "test_search.py": _SEARCH_TEST,
        },
        setup=['python3 -c "import search"'],
        verify=["python3 -I check_search.py"],
        verify_files={"check_search.py": _SEARCH_CHECK},
        artifacts=["search.py"],
        solution=[_SEARCH_SOLUTION],
    ),
    Preset(
        name="fizzbuzz",
        description="Passes with its reference solution (reward 1.0); two checker commands give partial credit.",
        instruction="Write `fizzbuzz.py` that prints the numbers 1 to 100, one per line, but `Fizz` for "
        "multiples of 3, `Buzz` for multiples of 5 and `FizzBuzz` for multiples of both.",
        verify=["python3 -I check_fizzbuzz.py 15", "python3 -I check_fizzbuzz.py 100"],
        verify_files={"check_fizzbuzz.py": _FIZZBUZZ_CHECK},
        artifacts=["fizzbuzz.py"],
        solution=[_FIZZBUZZ_SOLUTION],
    ),
    Preset(
        name="failing",
        description="Its reference solution is wrong on purpose: fails (reward 0.0).",
        instruction="Create `answer.txt` containing the number 42. (The reference solution here is wrong on "
        "purpose, so the oracle agent shows what a failed rollout looks like.)",
        verify=["test -f answer.txt", "grep -qx 42 answer.txt"],
        artifacts=["answer.txt"],
        solution=["true  # does nothing: both verify commands fail"],
    ),
)}
"""Preset name -> preset; the first is the tab's initial selection."""


def with_task_set(catalog: TaskCatalog) -> dict[str, Preset]:
    """The built-in presets, then every task of the server's task set (`serve --tasks`) as `<split>/<id>`: the tab
    is the operator's, so a task shows whole (its tests and solution too). Tasks whose Docker image must be built
    first are left out (the tab cannot build them)."""
    presets = dict(PRESETS)
    for split in catalog.split_names():
        for task in catalog.tasks(split):
            if task.loaded.environment is not None and task.loaded.request.image is None:
                continue
            fields = task.loaded.request.model_dump(exclude_unset=True, include=set(Task.model_fields))
            name = f"{split}/{task.id}"
            presets[name] = Preset.model_validate({**fields, "name": name, "description": f"task {task.index} of {split}"})
    return presets
