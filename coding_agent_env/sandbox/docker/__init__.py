"""The Docker backend: one container per rollout, its commands through the in-container launcher.

`backend` makes containers (and reaps orphans, `reaper`); `sandbox` is the `LauncherSandbox` of one
container, its files through the archive API (`archive`, `tar`); `transport` is how commands reach the
launcher, one of `control` (a socket to PID 1, with its `hostdir`) or `engine_exec` (engine execs), chosen
once; `layout` says where things are inside; `engine` is the SDK's edge (threads, error translation).
"""

from coding_agent_env.sandbox.docker.backend import DockerBackend
from coding_agent_env.sandbox.docker.reaper import LABEL_HOSTDIR, LABEL_OWNER, LABEL_ROLLOUT
from coding_agent_env.sandbox.docker.sandbox import DockerSandbox

__all__ = ["LABEL_HOSTDIR", "LABEL_OWNER", "LABEL_ROLLOUT", "DockerBackend", "DockerSandbox"]
