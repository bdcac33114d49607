#!/bin/bash
mkdir -p /logs/verifier
[ "$(id -u)" = 0 ] || { echo "the verifier runs as $(id -u), not root"; echo 0 > /logs/verifier/reward.txt; exit 0; }
python3 -I /tests/check_notice.py && echo 1 > /logs/verifier/reward.txt || echo 0 > /logs/verifier/reward.txt
