"""Summarise py-spy raw stacks (scripts/profile_quickstart.sh) per process, rollout actor and engine core: seconds of
samples at 40 Hz, and the inclusive time of the frames matching each regex given.

    python scripts/profile_summary.py /tmp/profile/quickstart0.txt specrl_openrlhf "EngineCore.step|_model_forward"
"""

import collections
import re
import sys

by_process = collections.Counter()
inclusive = collections.defaultdict(collections.Counter)
for line in open(sys.argv[1]):
    stack, _, count = line.rstrip().rpartition(" ")
    if not count.isdigit():
        continue
    count = int(count)
    frames = stack.split(";")
    procs = [f for f in frames if f.startswith("process ")]
    proc = re.sub(r"process \d+:", "", procs[-1]).strip('"') if procs else "?"
    by_process[proc] += count
    seen = set()
    for frame in frames:
        if frame.startswith("process "):
            continue
        m = re.match(r"(.*) \((.*?):\d+\)$", frame)
        name = f"{m.group(1)} [{m.group(2).split('site-packages/')[-1]}]" if m else frame
        if name not in seen:
            seen.add(name)
            inclusive[proc][name] += count
rate = 40.0
for proc, total in by_process.most_common():
    print(f"== {proc}: {total / rate:.1f} s of samples")
    for pattern in sys.argv[2:]:
        for name, count in inclusive[proc].most_common():
            if re.search(pattern, name) and count / total > 0.01:
                print(f"   {count / rate:6.1f} s {100 * count / total:5.1f}%  {name}")
