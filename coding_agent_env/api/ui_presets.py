"""Tasks the web tab offers as presets: a name -> the task fields of a `RolloutRequest`.

Each preset carries its reference `solution`, so the `oracle` agent scores it without an LLM:
`binary_search` and `fizzbuzz` pass (reward 1.0); `failing` has a wrong solution and fails (reward 0.0).
Each declares its `artifacts`, so verify runs in a clean room; `binary_search` keeps its tests in
`verify_files` too, so an edited or deleted test file changes nothing.
Presets are plain data; the tab shows them in its editors and builds the request from what the editors hold.
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["PRESETS", "Preset"]


@dataclass(frozen=True)
class Preset:
    """The task part of a rollout request."""

    instruction: str
    files: dict[str, str] = field(default_factory=dict)
    setup: list[str] = field(default_factory=list)
    verify: list[str] = field(default_factory=list)
    verify_files: dict[str, str] = field(default_factory=dict)
    artifacts: list[str] = field(default_factory=list)
    solution: list[str] = field(default_factory=list)


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

_FIZZBUZZ_CHECK = (
    "python3 fizzbuzz.py | python3 -c \"import sys; want = ['FizzBuzz' if i % 15 == 0 else 'Fizz' if i % 3 == 0 "
    "else 'Buzz' if i % 5 == 0 else str(i) for i in range(1, 101)]; "
    "sys.exit(sys.stdin.read().split() != want)\""
)

PRESETS: dict[str, Preset] = {
    "binary_search": Preset(
        instruction="Implement `binary_search(items, target)` in `search.py`: return the index of `target` in "
        "the sorted list `items`, or -1 if it is absent. Run `python3 -m unittest test_search` to check.",
        files={
            "search.py": "def binary_search(items, target):\n    raise NotImplementedError\n",
            "test_search.py": _SEARCH_TEST,
        },
        setup=['python3 -c "import search"'],
        verify=["python3 -m unittest -q test_search"],
        verify_files={"test_search.py": _SEARCH_TEST},
        artifacts=["search.py"],
        solution=[_SEARCH_SOLUTION],
    ),
    "fizzbuzz": Preset(
        instruction="Write `fizzbuzz.py` that prints the numbers 1 to 100, one per line, but `Fizz` for "
        "multiples of 3, `Buzz` for multiples of 5 and `FizzBuzz` for multiples of both.",
        verify=["test -f fizzbuzz.py", _FIZZBUZZ_CHECK],
        artifacts=["fizzbuzz.py"],
        solution=[_FIZZBUZZ_SOLUTION],
    ),
    "failing": Preset(
        instruction="Create `answer.txt` containing the number 42. (The reference solution here is wrong on "
        "purpose, so the oracle agent shows what a failed rollout looks like.)",
        verify=["test -f answer.txt", "grep -qx 42 answer.txt"],
        artifacts=["answer.txt"],
        solution=["true  # does nothing: both verify commands fail"],
    ),
}
"""Preset name -> task; the first is the tab's initial selection."""
