#!/bin/bash
# Runs in the workdir (/app). A missing answer is a failure, never two empty strings compared.
mkdir -p /logs/verifier
[ "$(pwd)" = /app ] || { echo "verify runs in $(pwd), not /app"; echo 0 > /logs/verifier/reward.txt; exit 0; }
[ -f /app/answer.txt ] || { echo "no /app/answer.txt"; echo 0 > /logs/verifier/reward.txt; exit 0; }
if [ "$(cat /app/answer.txt)" = "$(printf '7\n3')" ]; then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi
