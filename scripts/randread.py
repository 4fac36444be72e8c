#!/usr/bin/env python3
"""Random 4 KiB O_DIRECT reads of a store's table files, one at a time:
the device's latency and the kernel's CPU for each read, the floor under
a lookup's miss (BENCHMARKS.md, larger than memory).

  scripts/randread.py DB_DIR [READS]   (default 20000; Linux only)
"""
import glob
import mmap
import os
import random
import resource
import sys
import time

db = sys.argv[1]
n = int(sys.argv[2]) if len(sys.argv) > 2 else 20000
files = [f for f in glob.glob(os.path.join(db, "*.sst")) if os.path.getsize(f) > 1 << 20]
if not files:
    sys.exit(f"randread: no table file over 1 MiB in {db}")
fds = {f: os.open(f, os.O_RDONLY | os.O_DIRECT) for f in files}
buf = mmap.mmap(-1, 4096)  # page-aligned, as O_DIRECT needs
r = random.Random(1)
picks = []
for _ in range(n):
    f = r.choice(files)
    picks.append((fds[f], r.randrange(0, os.path.getsize(f) // 4096 - 1) * 4096))
t0, ru0 = time.time(), resource.getrusage(resource.RUSAGE_SELF)
for fd, off in picks:
    os.preadv(fd, [buf], off)
t1, ru1 = time.time(), resource.getrusage(resource.RUSAGE_SELF)
print(f"{db}: {n} reads of 4 KiB, {n / (t1 - t0):.0f} reads/s one at a time, "
      f"{(t1 - t0) / n * 1e6:.1f} us a read, {(ru1.ru_stime - ru0.ru_stime) / n * 1e6:.1f} us of it kernel CPU")
