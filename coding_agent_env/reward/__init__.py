"""Scoring: one reward path, computed in the environment and pure (no sandbox, no I/O); verify runs in `rollout`."""
