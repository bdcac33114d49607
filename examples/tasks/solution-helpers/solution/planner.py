import sys

count, found, n = int(sys.argv[1]), [], 2
while len(found) < count:
    if all(n % p for p in found):
        found.append(n)
    n += 1
print(" ".join(map(str, found)))
