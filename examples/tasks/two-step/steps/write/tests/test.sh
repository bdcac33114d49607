#!/bin/bash
mkdir -p /logs/verifier
[ -f /app/log.txt ] && [ "$(cat /app/log.txt)" = one ] && echo 1 > /logs/verifier/reward.txt || echo 0 > /logs/verifier/reward.txt
