"""The only package that imports fastapi, starlette, websockets and mcp: the server's wire surface (the `server`
extra; importing it without the extra says which to install)."""

try:
    from coding_agent_env.api.app import build_app
except ImportError as exc:  # fastapi, uvicorn or mcp >= 2 missing: a trainer-side install
    if exc.name and exc.name.split(".")[0] in ("fastapi", "starlette", "mcp", "mcp_types", "uvicorn"):
        raise ImportError(
            f"the server's dependencies are not installed ({exc.name}): pip install 'coding-agent-env[server]'"
        ) from exc
    raise

__all__ = ["build_app"]
