#!/bin/bash
set -e
echo 'hello, world' > /app/notice.txt
chmod 0644 /app/notice.txt
