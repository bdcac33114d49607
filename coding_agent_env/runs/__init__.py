"""Batch runs: many tasks, k attempts each, bounded concurrency, live progress, a resumable JSONL journal, a
summary (mean reward, pass@k, per-phase times) and the results store (SQLite, or PostgreSQL for several replicas)."""

from coding_agent_env.runs.batch import BatchPlan, Job, run_batch
from coding_agent_env.runs.executor import Executor, InProcessExecutor, ServerExecutor
from coding_agent_env.runs.journal import Journal, Record
from coding_agent_env.runs.stats import Summary

__all__ = ["BatchPlan", "Executor", "InProcessExecutor", "Job", "Journal", "Record", "ServerExecutor", "Summary",
           "run_batch"]
