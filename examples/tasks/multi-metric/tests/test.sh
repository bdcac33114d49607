#!/bin/bash
mkdir -p /logs/verifier
python3 -I /tests/score.py > /logs/verifier/reward.json
cat /logs/verifier/reward.json
