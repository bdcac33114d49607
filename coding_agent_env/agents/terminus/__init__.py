"""Terminus: the built-in agent (Python, no npm). See `terminus.agent` for the design.

`core`, `parse` and `loop` import only the standard library (and this package's `__init__` nothing at all),
so `loop` also runs as a standalone program with `python3 -I -S`, its commands in the sandbox's shell run on
the host (`sandbox.shell.host`). In the server, commands are sandbox execs (`sandbox.shell.sandboxed`).
"""
