# Checks `median` in the workdir's stats.py by its answers, trusting nothing stats.py can do.
#
# Run as `python3 -I /tests/check_stats.py` (isolated: nothing from the workdir or the environment is imported
# here). stats.py is imported only in a child process, which reads the cases on stdin and prints its answers as
# one JSON line; the cases are new random ones each run and their answers are computed here, so an artifact that
# exits at import (os._exit(0)) or patches what a test would use fails: only right answers pass. This process is
# made non-dumpable first, so the child cannot ptrace it.
import ctypes
import json
import os
import random
import statistics
import subprocess
import sys

PR_SET_DUMPABLE = 4
CHILD = '''import json, os, sys
sys.path.append(os.getcwd())
from stats import median
print(json.dumps([median(values) for values in json.load(sys.stdin)]))
'''


def main():
    if ctypes.CDLL(None, use_errno=True).prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) != 0:
        sys.exit("cannot make the checker non-dumpable")
    rng = random.SystemRandom()
    cases = [[3, 1, 2], [4, 1, 3, 2], [7]] + [[rng.randrange(-1000, 1000) for _ in range(n)] for n in range(1, 21)]
    env = {k: v for k, v in os.environ.items() if k != "REWARD_FILE"}
    try:
        child = subprocess.run([sys.executable, "-I", "-c", CHILD], input=json.dumps(cases), capture_output=True,
                               text=True, timeout=30, env=env)
    except subprocess.TimeoutExpired:
        sys.exit("median: no answer within 30 s")
    lines = child.stdout.strip().splitlines()
    try:
        answers = json.loads(lines[-1]) if lines else None
    except ValueError:
        answers = None
    if not isinstance(answers, list) or len(answers) != len(cases):
        sys.exit(f"median: no answers (exit code {child.returncode}): {child.stderr[-2000:]}")
    right = sum(answer == statistics.median(values) for answer, values in zip(answers, cases))
    print(f"median: {right}/{len(cases)} cases right")
    sys.exit(0 if right == len(cases) else 1)


main()
