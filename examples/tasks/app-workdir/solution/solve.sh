#!/bin/bash
set -e
cd /app
while read -r item; do grep "^$item," prices.csv | cut -d, -f2; done < /queries/items.txt > answer.txt
