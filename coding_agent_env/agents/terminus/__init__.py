"""Terminus: the built-in agent (Python, no npm). See `terminus.agent` for the design.

`core`, `parse`, `shell` and `loop` import only the standard library (and this package's `__init__` nothing
at all), so `loop` also runs as a standalone program with `python3 -I -S`.
"""
