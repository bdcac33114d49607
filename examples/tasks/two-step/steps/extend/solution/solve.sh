#!/bin/bash
cat /app/next.txt >> /app/log.txt
