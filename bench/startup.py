"""Start-up: launch to `/health` and launch to `/web` answering 200, for this server (web tab on and off) and for
a reference built with openenv 0.10.0's `create_app` (the same one-tool MCP environment as `bench/ws.py`, its
Gradio web interface on and off), each a fresh process, interleaved, in the same run.

    .venv/bin/python bench/startup.py [RUNS]

Needs the openenv 0.10.0 virtualenv (`.ci/venvs/openenv-0.10.0`, created by the compat tests). Polls every
10 ms with a deadline; kills only the processes it started.
"""

from __future__ import annotations

import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.ws import REFERENCE_APP, REFERENCE_VENV, ROOT, free_port  # noqa: E402

DEADLINE_S = 120.0


def launch(argv: list[str], port: int, env: dict[str, str], cwd: Path, web: bool) -> tuple[float, float | None]:
    """(seconds to /health 200, seconds to /web/ 200 or None without a tab) for one fresh process."""
    started = time.monotonic()
    proc = subprocess.Popen(argv, cwd=cwd, env=env, start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    health: float | None = None
    try:
        with httpx.Client(timeout=5) as http:
            while True:
                if proc.poll() is not None or time.monotonic() - started > DEADLINE_S:
                    raise SystemExit(f"{argv[:4]} did not come up")
                try:
                    if health is None:
                        if http.get(url + "/health").status_code == 200:
                            health = time.monotonic() - started
                            if not web:
                                return health, None
                    elif http.get(url + "/web/").status_code == 200:
                        return health, time.monotonic() - started
                except httpx.TransportError:
                    pass
                time.sleep(0.01)
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)


def main(runs: int) -> None:
    python = REFERENCE_VENV / "bin" / "python"
    if not python.exists():
        raise SystemExit(f"no openenv 0.10.0 virtualenv at {REFERENCE_VENV} (run tests/compat once)")
    work = Path(tempfile.mkdtemp(prefix="cae-bench-startup-"))
    try:
        measure(runs, python, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def measure(runs: int, python: Path, work: Path) -> None:
    """Start each server `runs` times in `work` (the reference app's dir, our state dir under it); print the
    medians."""
    (work / "reference_app.py").write_text(REFERENCE_APP)
    # Gradio's temp dir (else $TMPDIR/gradio) in `work`, removed with it.
    base = {**os.environ, "GRADIO_ANALYTICS_ENABLED": "False", "GRADIO_TEMP_DIR": str(work / "gradio")}
    cases = {}
    for web in (True, False):
        flag = "true" if web else "false"
        cases[f"ours, tab {'on' if web else 'off'}"] = (
            lambda port, flag=flag: ([sys.executable, "-m", "coding_agent_env.cli", "serve", "--port", str(port)],
                                     {**base, "ENABLE_WEB_INTERFACE": flag, "STATE_DIR": str(work / "state")},
                                     ROOT), web)
        cases[f"openenv 0.10, tab {'on' if web else 'off'}"] = (
            lambda port, flag=flag: ([str(python), "-m", "uvicorn", "reference_app:app", "--host", "127.0.0.1",
                                      "--port", str(port)], {**base, "ENABLE_WEB_INTERFACE": flag}, work), web)
    samples: dict[str, list[tuple[float, float | None]]] = {name: [] for name in cases}
    for _ in range(runs):
        for name, (make, web) in cases.items():
            port = free_port()
            argv, env, cwd = make(port)
            samples[name].append(launch(argv, port, env, cwd, web))
    print(f"launch to first 200, median of {runs} fresh processes each (interleaved)")
    print(f"{'server':24} {'/health s':>10} {'/web s':>8}")
    medians = {}
    for name, rows in samples.items():
        health = statistics.median(r[0] for r in rows)
        webs = [r[1] for r in rows if r[1] is not None]
        web = statistics.median(webs) if webs else None
        medians[name] = (health, web)
        print(f"{name:24} {health:10.2f} {'' if web is None else f'{web:8.2f}'}")
    ours, ref = medians["ours, tab on"], medians["openenv 0.10, tab on"]
    print(f"ratio /health ours / openenv (tab on): {ours[0] / ref[0]:.2f}x; /web: {(ours[1] or 0) / (ref[1] or 1):.2f}x")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 5)
