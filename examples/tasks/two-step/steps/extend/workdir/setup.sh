#!/bin/bash
# Staged before this step's agent, in the workdir.
echo two > /app/next.txt
