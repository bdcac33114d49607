#!/bin/bash
echo one > /app/log.txt
