"""The `coding-agent-env` command: `main` parses and dispatches (`cli.main`), one module per subcommand family
that is not a room's own (`cli.agents`; `run` and `runs` are `runs.command` and `runs.browse`, `gate` is
`gate.process`). Nothing below imports this package."""
