"""What the path guard costs a verify command: Python's start-up (`python3 -c pass` and `python3 -m unittest` of
one test in a workdir) with the safe path alone (the reference, today's hardening without a guard) and with the
guard on PYTHONPATH, each a fresh process, interleaved, in the same run.

    .venv/bin/python bench/verify_guard.py [RUNS] [PYTHON]

PYTHON defaults to /usr/bin/python3 (what a local sandbox runs: Debian's, with its own sitecustomize to chain).
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench._common import describe  # noqa: E402
from coding_agent_env.sandbox import pathguard  # noqa: E402

RUNS = 200
TIMEOUT_S = 30
TEST = "import unittest\n\n\nclass T(unittest.TestCase):\n    def test(self):\n        pass\n"


def main() -> None:
    runs = int(sys.argv[1]) if len(sys.argv) > 1 else RUNS
    python = sys.argv[2] if len(sys.argv) > 2 else "/usr/bin/python3"
    with tempfile.TemporaryDirectory(prefix="cae-bench-guard-") as tmp:
        work = Path(tmp) / "work"
        work.mkdir()
        (work / "test_x.py").write_text(TEST)
        guard = str(pathguard.install(Path(tmp)))
        base = {"PATH": "/usr/bin:/bin", "PYTHONSAFEPATH": "1", "PYTHONNOUSERSITE": "1"}
        # The safe path alone cannot import test_x from the workdir: its unittest case names the file by path.
        cases = {
            "-c pass, safe path alone": (["-c", "pass"], {**base, "PYTHONPATH": ""}),
            "-c pass, with the guard": (["-c", "pass"], {**base, "PYTHONPATH": guard}),
            "unittest, safe path alone": (["-m", "unittest", "discover", "-q", "-s", ".", "-p", "test_x.py"],
                                          {**base, "PYTHONPATH": ""}),
            "unittest, with the guard": (["-m", "unittest", "-q", "test_x"], {**base, "PYTHONPATH": guard}),
        }
        samples: dict[str, list[float]] = {name: [] for name in cases}
        for i in range(runs + 5):
            for name, (args, env) in cases.items():
                t0 = time.perf_counter()
                subprocess.run([python, *args], cwd=work, env=env, check=True, capture_output=True,
                               timeout=TIMEOUT_S)
                if i >= 5:  # warm-ups
                    samples[name].append(time.perf_counter() - t0)
        for name, values in samples.items():
            print(describe(name, values))
        for what in ("-c pass", "unittest"):
            ref = statistics.median(samples[f"{what}, safe path alone"])
            with_guard = statistics.median(samples[f"{what}, with the guard"])
            print(f"{what:10} guard / reference (p50): {with_guard / ref:5.2f}x  (+{(with_guard - ref) * 1000:.2f} ms)")


if __name__ == "__main__":
    main()
