"""The only package that imports fastapi, starlette, websockets and mcp: the server's wire surface."""

from coding_agent_env.api.app import build_app

__all__ = ["build_app"]
