"""Wire dialects an agent may speak to the relay, each translated to and from the upstream's chat completions:
one module per dialect, pure (no I/O). Today: Anthropic Messages (`anthropic`)."""
