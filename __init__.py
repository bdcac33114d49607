"""OpenEnv package face for coding_agent_env: re-exports only; all code lives in coding_agent_env/."""
