"""In-sandbox process launcher for backends whose engine runs commands for us (docker, hf, e2b).

Standard library only and importing nothing from this package: backends copy this file and its modules
(`FILES`: `procs.py` for the process modes, `initd.py` for `init`, `fileops.py` for the file modes,
`treeops.py` to remove trees) into one
directory of the sandbox and run it as `python3 launcher.py MODE ...`. Modes:

- `run --token T --run-dir D [--timeout S] [--cwd C] [--uid U | --user NAME] [--env-keys K1,K2 |
  --env-file F] [--fresh-base B] [--rlimit NAME=V ...] [--log F] -- ARGV...`: becomes a child subreaper (so nothing the
  command forks can escape to PID 1, not even through `setsid`), starts ARGV in its own session with exactly
  the given environment (from the listed variables of its own environment, or from a JSON file it deletes
  after reading), waits up to the timeout, then SIGKILLs every descendant still alive. It exits with the
  command's code; when the command died of a signal or timed out it exits 128+signal and leaves
  `D/T.status` (JSON `{"signal": N, "timed_out": bool}`) for the backend to read. SIGTERM to the launcher
  kills the tree the same way. Its pid is kept in `D/T.pid` while it runs. The command runs as `--uid U`
  (group U, no other groups), or as `--user NAME` (a name or uid looked up in the sandbox's own user
  database, with its groups; an unknown name: exit 127), or as the launcher's own user; root keeps the
  capabilities the sandbox gives its root, any other uid has none.
- `kill --token T --run-dir D`: SIGTERM that launcher and wait (bounded) until it is gone; a launcher
  that has not started yet exits as soon as it does.
- `killall --run-dir D`: the same for every launcher that has a pid file in D.
- `init [--dirs SPEC] [--links LINK=TARGET,...] [--forward-socket SOCKET --forward-port PORT] [--ctl SOCKET [--ctl-key FILE]]`: a PID 1 for
  containers. It reaps zombies. With `--dirs` (`PATH:UID:OCTAL_MODE,...`) it first makes those
  directories (parents root-owned 0755) and sets their owner and mode. With `--forward-*` it starts the LLM
  forwarder (as root, `python3 -I -S forwarder.py --detach`) on 127.0.0.1:PORT piping to SOCKET and waits
  (bounded) for its exit code (0: it listens). With `--ctl`
  it then connects to the host's SOCK_SEQPACKET control socket and sends one JSON `{"error": str}` (""
  when ready; with `--ctl-key`, also `"key"`: FILE's content, which proves to the host that the connection is
  this PID 1's and not another process's that can reach the socket's path). After that, each control message carries three fds (request/reply socket, stdout, stderr):
  init forks a child (a fork that fails -- the pids limit is full -- leaves the request without a reply:
  its fds are closed and init keeps serving) that reads the request JSON `{"argv", "env", "uid"}` until
  EOF, runs it with exactly that environment, stdin /dev/null, stdout/stderr on the two fds and cwd `/`
  (launcher modes in-process, anything else in a child it waits for, as `uid` when given), then writes
  the reply JSON
  `{"code": int, "status": str|null}` (`status`: the run's status file, when a `run` left one). Commands
  thus start without the engine's exec API. A message `k` (rather than `r`) is a `kill` request, which init
  handles itself without forking (`initd._serve_kill`), so an agent that fills the pids limit can still be
  killed. A message `a` carries four fds (request/reply socket, stdin, stdout, stderr): the same, with the
  command's stdin on the second (an attached process: the live shell's supervisor, whose channel thus never
  passes through the sandbox's files). Commands start with SIGPIPE and SIGXFSZ at their default actions
  (Python ignores both). A closed control socket leaves init a plain reaper.
- `list PATH MAX`: JSON listing of a tree without following symlinks (one object on stdout).
- `stat PATH`: JSON `{"real": realpath, "kind": ...}` of PATH (missing: `{"real": null}`).
- `remove PATH ROOT`: remove PATH below ROOT without following any symlink, ROOT's own path excepted
  (missing: not an error).
- `read PATH MAX head|tail`: at most MAX bytes of the regular file PATH, base64-encoded on stdout.
- `prepare PATH ROOT [--uid U]`: make PATH's parents below ROOT real directories (owned by U), unlink a
  symlink at PATH.
- `dirs SPEC`: make directories as `init --dirs` does (`PATH:UID:OCTAL_MODE,...`), and set their owner and
  mode when they exist (a mount's root after the image's content was copied onto it).
"""

from __future__ import annotations

import os
import sys

# Run as `python3 -I -S launcher.py`, the script's own directory is not on the path: its modules are beside it.
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import fileops  # noqa: E402
import initd  # noqa: E402
import procs  # noqa: E402

FILES = ("launcher.py", "procs.py", "initd.py", "fileops.py", "treeops.py")
"""The launcher's files, copied together into a sandbox's machinery directory."""


def main(argv: list[str]) -> int:
    mode, rest = argv[0], argv[1:]
    if mode == "run":
        return procs.run(rest)
    if mode == "kill":
        args, _, _ = procs.parse(rest)
        return procs.kill(args["run-dir"], args["token"])
    if mode == "killall":
        args, _, _ = procs.parse(rest)
        return procs.killall(args["run-dir"])
    if mode == "init":
        return initd.init(rest, main, os.path.abspath(__file__))
    if mode == "list":
        return fileops.listing(rest[0], int(rest[1]))
    if mode == "stat":
        return fileops.stat_path(rest[0])
    if mode == "remove":
        return fileops.remove(rest[0], rest[1])
    if mode == "read":
        return fileops.read_slice(rest[0], int(rest[1]), rest[2])
    if mode == "dirs":
        initd.make_dirs(rest[0])
        return 0
    if mode == "prepare":
        args, _, _ = procs.parse(rest[2:])
        return fileops.prepare(rest[0], rest[1], int(args["uid"]) if "uid" in args else None)
    print(f"unknown mode {mode!r}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
