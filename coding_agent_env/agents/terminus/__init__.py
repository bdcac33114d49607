"""Terminus: the built-in agent (Python, no npm). See `terminus.agent` for the design.

Only the standard library is imported by `parse`, `shell` and `loop`: they are shipped into the sandbox.
"""
