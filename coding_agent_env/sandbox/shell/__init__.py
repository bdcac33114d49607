"""The sandbox's persistent shell: one command at a time, `cd` and exported variables kept between commands,
each command's tree killed at its timeout, its output bounded.

- `runner`: the shell itself (the bash scripts a command runs in, and where its files go), standard library only;
- `sandboxed`: `SandboxShell`, the runner as one sandbox exec per command (interactive episodes and Terminus in
  the server);
- `host`: `PersistentShell`, the runner as a host subprocess (Terminus's standalone program).

Nothing is imported here: `runner` and `host` also run as part of Terminus's standalone program, on the
standard library alone, where this package is the top-level `shell` (see `agents.terminus.loop`).
"""
