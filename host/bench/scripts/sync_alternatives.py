# Side-by-side costs of the ways to make N found chunks durable (issue 37):
# python3 host/bench/scripts/sync_alternatives.py DIR N SIZE (DIR on the medium to measure).
import os, time, ctypes, statistics, sys
libc = ctypes.CDLL("libc.so.6", use_errno=True)
root = sys.argv[1]; n = int(sys.argv[2]); size = int(sys.argv[3])
d = os.path.join(root, "chunks"); os.makedirs(d, exist_ok=True)
paths = []
for i in range(n):
    p = os.path.join(d, "c%04d" % i)
    with open(p, "wb") as f: f.write(os.urandom(size)); f.flush(); os.fdatasync(f.fileno())
    paths.append(p)
dfd = os.open(d, os.O_RDONLY); os.fsync(dfd)
def per_file():
    for p in paths:
        fd = os.open(p, os.O_RDONLY); os.fdatasync(fd); os.close(fd)
    os.fsync(dfd)
def syncfs():
    if libc.syncfs(dfd) != 0: raise OSError(ctypes.get_errno())
def stats():
    for p in paths: os.stat(p, follow_symlinks=False)
def manifest():
    t = os.path.join(root, "m.tmp")
    with open(t, "wb") as f: f.write(b"x" * 64); f.flush(); os.fdatasync(f.fileno())
    os.rename(t, os.path.join(root, "m")); rfd = os.open(root, os.O_RDONLY); os.fsync(rfd); os.close(rfd)
def dirty_elsewhere(mib):
    with open(os.path.join(root, "other"), "wb") as f: f.write(os.urandom(mib << 20))
for name, fn, pre in [("fdatasync each found chunk + dir fsync", per_file, None),
                      ("one syncfs, nothing else dirty", syncfs, None),
                      ("one syncfs, 64 MiB of another writer dirty", syncfs, lambda: dirty_elsewhere(64)),
                      ("stat each found chunk (the host's check)", stats, None),
                      ("manifest: write, fdatasync, rename, dir fsync", manifest, None)]:
    xs = []
    for _ in range(7):
        if pre: pre()
        t = time.perf_counter(); fn(); xs.append((time.perf_counter() - t) * 1e3)
    xs.sort()
    print("| %s | %.2f [%.2f–%.2f] |" % (name, statistics.median(xs), xs[0], xs[-1]))
