#!/bin/bash
# The checker runs stats.py in a child process and judges its answers (see check_stats.py), so stats.py cannot
# pass by exiting at import.
mkdir -p /logs/verifier
if python3 -I /tests/check_stats.py; then echo '{"reward": 1.0}' > /logs/verifier/reward.json; else echo '{"reward": 0.0}' > /logs/verifier/reward.json; fi
