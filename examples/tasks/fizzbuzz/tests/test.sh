#!/bin/bash
# Partial credit: the share of the first 15 lines that are right.
mkdir -p /logs/verifier
python3 /tests/test_fizzbuzz.py > /logs/verifier/reward.txt 2>/dev/null || echo 0 > /logs/verifier/reward.txt
