import subprocess
import sys

out = subprocess.run([sys.executable, "fizzbuzz.py", "15"], capture_output=True, text=True, timeout=30).stdout.split()
expected = ["1", "2", "Fizz", "4", "Buzz", "Fizz", "7", "8", "Fizz", "Buzz", "11", "Fizz", "13", "14", "FizzBuzz"]
print(sum(a == b for a, b in zip(out, expected)) / len(expected))
