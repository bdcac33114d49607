"""The local backend: bubblewrap (or, where it cannot run, Landlock and seccomp; or, by the operator's choice,
plain host processes) over per-rollout host directories.

`backend` makes sandboxes; `probe` picks the isolation mode once and `launch` is one strategy per mode
(`landlocked` the Landlock one; `refusal` says why none can run);
`sandbox` runs commands (`proc`: host processes killed by group) and file operations (`hostfs`) on the host;
`provision` makes and reaps sandbox roots; `uids` hands out host uids as root; `netns`, `enter` and `relay`
are the root-only network namespace per sandbox, the compiled entry helper and the relay served inside.
"""

from coding_agent_env.sandbox.local.backend import LocalBackend
from coding_agent_env.sandbox.local.sandbox import LocalSandbox

__all__ = ["LocalBackend", "LocalSandbox"]
