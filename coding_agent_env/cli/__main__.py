"""`python -m coding_agent_env.cli`: the `coding-agent-env` command."""

from coding_agent_env.cli.main import main

raise SystemExit(main())
