"""OpenEnv entry point: `uvicorn server.app:app` (from the repository root) or `python -m server.app`."""

from coding_agent_env.api import build_app
from coding_agent_env.serve import hide_secrets, launched_by_uvicorn
from coding_agent_env.serve import main as _serve_main
from coding_agent_env.settings import Settings

if launched_by_uvicorn():
    hide_secrets()  # `uvicorn server.app:app`: re-executed without the operator secrets in its environment
app = build_app(Settings.from_env())


def main() -> None:
    """Serve this package's app (the `server` script of OpenEnv's layout); same flags as `coding-agent-env serve`."""
    raise SystemExit(_serve_main())


if __name__ == "__main__":
    main()
