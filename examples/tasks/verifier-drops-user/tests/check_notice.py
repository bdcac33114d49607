"""Reads the notice as `nobody`: the verifier is root and switches user, as Harbor's verifiers may."""
import subprocess
import sys

done = subprocess.run(["cat", "/app/notice.txt"], user="nobody", group="nogroup", capture_output=True, text=True)
print("as nobody:", done.returncode, done.stdout.strip(), done.stderr.strip())
sys.exit(0 if done.returncode == 0 and done.stdout.strip() == "hello, world" else 1)
