#!/bin/bash
mkdir -p /logs/verifier
if [ -f /app/primes.txt ] && [ "$(cat /app/primes.txt)" = "2 3 5 7 11 13 17 19 23 29" ]; then
  echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi
