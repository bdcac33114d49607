"""Verification and scoring: one reward path, computed in the environment."""
