"""Launcher-driven sandboxes (Docker, hf, e2b): the in-sandbox launcher and the host side that drives it.

`inside/` holds the launcher's own files (standard library only, copied into each sandbox); `client` builds
its argv and reads its statuses; `transport` is the small interface each engine implements; `sandbox` is the
`LauncherSandbox` base with the launcher side's run, kill and exit-status policy.
"""

from coding_agent_env.sandbox.launcher.sandbox import LauncherProcess, LauncherSandbox
from coding_agent_env.sandbox.launcher.transport import Ran, Transport

__all__ = ["LauncherProcess", "LauncherSandbox", "Ran", "Transport"]
