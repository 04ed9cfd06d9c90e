"""Count the words of a file: the "application" of examples/envs_and_mounts.yaml."""

import collections
import sys

words = open(sys.argv[1], encoding="utf-8").read().lower().split()
counts = collections.Counter(w.strip(".,;:!?\"'") for w in words)
print(f"{len(words)} words, {len(counts)} distinct; most common:")
for word, n in counts.most_common(3):
    print(f"  {word}: {n}")
