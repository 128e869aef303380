#!/usr/bin/env python3
"""The patched llama-server (examples/llama-server) saves and restores slots
through kv_store_v1 backends, driven through its real HTTP API.

    llama-server-e2e.py            the tests (tests/tests/llama_server.rs)
    llama-server-e2e.py --bench    the side-by-side with upstream's slot files

Run by scripts/llama-e2e.sh (--server, --bench), which builds what is needed
and passes it in the environment:
  LLAMA_SERVER          the patched llama-server binary
  LLAMA_MODEL           the tiny model (tests) or the bench model (--bench)
  KVWASM_SHIM_DIR       directory holding libkv_store_wasm.so
  KVWASM_NATIVE_DIR     directory holding libkv_store_cfs.so (examples/native-backend)
  KVWASM_HOSTILE_GUEST  the hostile test guest component (tests only)
  KVWASM_BENCH_DIR      --bench: where the stores go (one disk for both sides)
  KV_SLOT_TRACE         --bench: print the servers' kv_slot lines (where the time went)
  KVWASM_BENCH_BASELINE --bench: another llama-server build (e.g. the previous patch's): its fs
                        sides run in the same bench, beside this build's
  KVWASM_BENCH_BASELINE_SHIM_DIR --bench: another build's libkv_store_wasm.so (its directory):
                        the baseline fs sides load it (with this llama-server unless
                        KVWASM_BENCH_BASELINE names another)
Starts its own redis-server on a free loopback port. Prints one line per
check; exits non-zero on the first failure.
"""

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

SERVER = os.environ["LLAMA_SERVER"]
MODEL = os.environ["LLAMA_MODEL"]
SHIM_DIR = os.environ["KVWASM_SHIM_DIR"]
NATIVE_DIR = os.environ.get("KVWASM_NATIVE_DIR", "")
HOSTILE = os.environ.get("KVWASM_HOSTILE_GUEST", "")
N_VOCAB = 259


def fail(msg):
    print(f"llama-server-e2e: FAILED: {msg}", file=sys.stderr, flush=True)
    sys.exit(1)


def check(cond, msg):
    if not cond:
        fail(msg)


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def tokens(seed, n):
    """n pseudo-random token ids (xorshift64), avoiding the 3 specials: the
    same stream as examples/llama-slot's SEED:LEN segments."""
    x = (seed * 0x9E3779B97F4A7C15 + 1) & 0xFFFFFFFFFFFFFFFF
    out = []
    for _ in range(n):
        x ^= (x << 13) & 0xFFFFFFFFFFFFFFFF
        x ^= x >> 7
        x ^= (x << 17) & 0xFFFFFFFFFFFFFFFF
        out.append(3 + x % (N_VOCAB - 3))
    return out


class Redis:
    def __init__(self, work):
        self.port = free_port()
        self.password = f"llama-server-{os.getpid()}"
        conf = os.path.join(work, "redis.conf")
        with open(conf, "w") as f:
            f.write(
                f"bind 127.0.0.1\nport {self.port}\ndir {work}\nsave \"\"\n"
                f"requirepass {self.password}\nlogfile {work}/redis.log\n"
            )
        self.proc = subprocess.Popen(["redis-server", conf], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for _ in range(600):
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return
            except OSError:
                check(self.proc.poll() is None, "redis-server exited")
                time.sleep(0.1)
        fail("redis-server does not listen")

    def stop(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


class Server:
    """One llama-server process on a free loopback port."""

    def __init__(self, slot_path, work, n_parallel=1, n_ctx=1024, threads=1, env=None, name="server", server=None):
        self.port = free_port()
        self.log_path = os.path.join(work, f"{name}-{self.port}.log")
        args = [
            server or SERVER, "-m", MODEL, "--host", "127.0.0.1", "--port", str(self.port),
            "-np", str(n_parallel), "-c", str(n_ctx * n_parallel), "-t", str(threads), "-tb", str(threads),
            "--cache-ram", "0", "--no-warmup", "-fa", "on", "--slot-save-path", slot_path,
        ]
        self.log = open(self.log_path, "w")
        full_env = dict(os.environ, **(env or {}))
        self.proc = subprocess.Popen(args, stdout=self.log, stderr=subprocess.STDOUT, env=full_env)
        # Ready when /health answers 200; a process that exits is a failure.
        for _ in range(3000):
            if self.proc.poll() is not None:
                fail(f"llama-server exited ({self.proc.returncode}) at start-up:\n{self.tail()}")
            try:
                status, _ = self.request("GET", "/health")
                if status == 200:
                    return
            except OSError:
                pass
            time.sleep(0.1)
        fail(f"llama-server not ready:\n{self.tail()}")

    def tail(self):
        with open(self.log_path) as f:
            return "".join(f.readlines()[-30:])

    def request(self, method, path, body=None):
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(f"http://127.0.0.1:{self.port}{path}", data=data, method=method)
        req.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(req, timeout=600) as r:
                return r.status, json.loads(r.read() or b"null")
        except urllib.error.HTTPError as e:
            raw = e.read()
            try:
                return e.code, json.loads(raw)
            except ValueError:
                return e.code, raw.decode(errors="replace")

    def complete(self, prompt, n_predict=6, slot=0):
        status, j = self.request("POST", "/completion", {
            "prompt": prompt, "n_predict": n_predict, "id_slot": slot, "cache_prompt": True,
            "seed": 42, "temperature": 0, "top_k": 1, "n_probs": 3, "return_tokens": True,
        })
        check(status == 200, f"completion: {status} {j}\n{self.tail()}")
        return j

    def slot_action(self, slot, action, body):
        return self.request("POST", f"/slots/{slot}?action={action}", body)

    def save(self, slot, name):
        status, j = self.slot_action(slot, "save", {"filename": name})
        check(status == 200, f"save {name}: {status} {j}\n{self.tail()}")
        return j

    def restore(self, slot, name):
        status, j = self.slot_action(slot, "restore", {"filename": name})
        check(status == 200, f"restore {name}: {status} {j}\n{self.tail()}")
        return j

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


def answer(j):
    """What must match between two servers: the tokens and their probabilities."""
    return {"tokens": j["tokens"], "probs": j["completion_probabilities"], "content": j["content"]}


# The conversation of the restart test: a first turn, then a second that
# extends it (the first turn's prompt and answer, then new tokens).
TURN1 = tokens(1, 300)
NEW = tokens(2, 20)


def turn2(first):
    return TURN1 + first["tokens"] + NEW


def reference(work):
    """A server that never restarts: both turns in one process."""
    s = Server(os.path.join(work, "plain"), work, name="reference")
    first = s.complete(TURN1)
    second = s.complete(turn2(first))
    s.stop()
    check(second["timings"]["prompt_n"] < len(turn2(first)), f"the reference reused no cache: {second['timings']}")
    return first, second


def restart_roundtrip(work, save_uri, restore_uri, env, ref, label):
    first_ref, second_ref = ref
    a = Server(save_uri, work, env=env, name=f"save-{label}")
    first = a.complete(TURN1)
    check(answer(first) == answer(first_ref), f"{label}: first turn differs from the reference")
    saved = a.save(0, "conversation")
    a.stop()
    b = Server(restore_uri, work, env=env, name=f"restore-{label}")
    restored = b.restore(0, "conversation")
    second = b.complete(turn2(first))
    b.stop()
    check(restored["n_restored"] == saved["n_saved"], f"{label}: restored {restored} after saving {saved}")
    check(restored["n_read"] == saved["n_written"], f"{label}: read {restored['n_read']} of {saved['n_written']}")
    check(restored["n_chunks"] == saved["n_chunks"], f"{label}: chunks {restored} vs {saved}")
    check(answer(second) == answer(second_ref),
          f"{label}: second turn after a restart differs:\n{answer(second)}\n{answer(second_ref)}")
    check(second["timings"]["prompt_n"] == second_ref["timings"]["prompt_n"],
          f"{label}: prompt_n {second['timings']} vs the reference's {second_ref['timings']}")
    log(f"ok  restart {label}: saved {saved['n_saved']} tokens ({saved['n_written']} bytes, "
        f"{saved['n_chunks']} chunks, {saved['n_chunks_stored']} stored), restored {restored['n_restored']} "
        f"in a new process; second turn evaluated {second['timings']['prompt_n']} of "
        f"{len(turn2(first))} prompt tokens; tokens and probabilities identical")
    return saved


def dir_bytes(path):
    total = 0
    for root, _, files in os.walk(path):
        total += sum(os.path.getsize(os.path.join(root, f)) for f in files)
    return total


def ten_slots(work, env):
    """Ten slots whose prompts share a 600-token system prompt: the chunks
    of the shared rows are stored once."""
    system = tokens(10, 600)
    users = [tokens(100 + i, 40) for i in range(10)]
    store_dir = os.path.join(work, "ten-kv")
    files_dir = os.path.join(work, "ten-files")
    os.makedirs(files_dir)
    results = {}
    for label, path in (("kvwasm", f"wasm://{store_dir}"), ("files", files_dir)):
        s = Server(path, work, n_parallel=10, env=env, name=f"ten-{label}")
        saves = []
        for i in range(10):
            s.complete(system + users[i], n_predict=1, slot=i)
            saves.append(s.save(i, f"slot{i}"))
        s.stop()
        results[label] = saves
    kv = results["kvwasm"]
    # 640 cells per slot, 256 rows per chunk: per region (K and V of 4
    # layers) 3 chunks, the first 2 inside the shared prefix; a header
    # chunk; the descriptors of regions 2 to 8, one chunk each, all the same
    # (one type and row size), so stored once; and for slots 0-8 the cell
    # counts of the later (empty) streams.
    descriptors = 7
    for i, j in enumerate(kv):
        chunks = 1 + descriptors + 8 * 3 + (1 if i < 9 else 0)
        check(j["n_chunks"] == chunks, f"slot {i}: {j}")
        want_dedup = descriptors - 1 if i == 0 else descriptors + 16
        check(j["n_chunks_deduplicated"] == want_dedup and j["n_chunks_stored"] == chunks - want_dedup,
              f"slot {i}: expected {want_dedup} deduplicated chunks: {j}")
    # The plain directory holds upstream's files: llama_state_seq_save_file's
    # bytes, which are the state kvwasm stored less llama_state_seq_get_data's
    # 8-byte io header (magic, sequence id).
    for i in range(10):
        state = stored_state(store_dir, f"slot{i}")
        head = 12 + 4 * int.from_bytes(state[8:12], "little")
        with open(os.path.join(files_dir, f"slot{i}"), "rb") as f:
            check(f.read() == state[:head] + state[head + 8:], f"slot {i}: upstream's file is not the stored state")
    check(sorted(os.listdir(files_dir)) == sorted(f"slot{i}" for i in range(10)), "upstream's directory")
    kv_bytes = dir_bytes(store_dir)
    file_bytes = dir_bytes(files_dir)
    check(file_bytes == sum(j["n_written"] for j in results["files"]), "upstream's files")
    check(kv_bytes < 0.4 * file_bytes, f"kvwasm stored {kv_bytes} bytes, upstream's files {file_bytes}")
    log(f"ok  ten slots sharing a 600-token system prompt: kvwasm stored {kv_bytes} bytes "
        f"({sum(j['n_chunks_stored'] for j in kv)} chunks stored, "
        f"{sum(j['n_chunks_deduplicated'] for j in kv)} deduplicated), upstream's ten files {file_bytes} bytes "
        f"({kv_bytes / file_bytes:.2f}x)")


def at_two_thirds(paths):
    """Of chunk files in a state's order, the one holding the byte two
    thirds into them (KV rows, whose chunks hold nearly all the bytes)."""
    check(len(paths) > 2, f"chunks: {paths}")
    sizes = [os.path.getsize(p) for p in paths]
    at = 2 * sum(sizes) // 3
    for path, size in zip(paths, sizes):
        if at < size:
            return path
        at -= size


def manifest_chunk_paths(store_dir, name):
    """The fs guest's files of manifest `name`'s chunks, in the state's order."""
    with open(os.path.join(store_dir, name), "rb") as f:
        m = f.read()
    hashes = [m[24 + 12 * i: 32 + 12 * i].hex() for i in range(int.from_bytes(m[12:16], "little"))]
    return [os.path.join(store_dir, "chunks", h[0], h) for h in hashes]


def stored_state(store_dir, name):
    """A state read back from the fs guest's files: the manifest (docs/llama.md)
    names the chunks, stored at chunks/<first hex digit>/<hex of the hash>."""
    with open(os.path.join(store_dir, name), "rb") as f:
        m = f.read()
    check(m[:4] == b"KVLS", f"manifest {name}")
    out = b""
    for path in manifest_chunk_paths(store_dir, name):
        with open(path, "rb") as f:
            out += f.read()
    check(len(out) == int.from_bytes(m[16:24], "little"), f"manifest {name}: size")
    return out


def cached_prompt_n(s, prompt):
    """prompt_n of a completion whose prompt the slot already holds."""
    return s.complete(prompt, n_predict=1)["timings"]["prompt_n"]


def expect_error(s, action, body, want_status, want_text, label, slot_prompt, baseline):
    status, j = s.slot_action(0, action, body)
    text = json.dumps(j)
    check(status == want_status and want_text in text, f"{label}: expected {want_status} with '{want_text}': {status} {j}")
    # the server still answers, and slot 0 still holds its prompt
    n = cached_prompt_n(s, slot_prompt)
    check(n == baseline, f"{label}: slot 0 changed: prompt_n {n}, before {baseline}")
    log(f"ok  {label}: HTTP {status} {j.get('error', {}).get('message', j) if isinstance(j, dict) else j}; "
        f"the server still serves, slot 0 unchanged")


def bad_cases(work, env, redis):
    prompt = tokens(20, 200)
    store_dir = os.path.join(work, "bad")
    s = Server(f"wasm://{store_dir}", work, env=env, name="bad")
    s.complete(prompt, n_predict=1)
    baseline = cached_prompt_n(s, prompt)
    check(baseline < len(prompt), f"a repeated prompt is evaluated again: {baseline}")
    full = Server(os.path.join(work, "plain"), work, name="no-cache")
    check(cached_prompt_n(full, prompt) == len(prompt), "a fresh slot evaluates the whole prompt")
    full.stop()

    expect_error(s, "save", {}, 400, "'filename' not found", "save without a filename", prompt, baseline)
    expect_error(s, "restore", {}, 400, "'filename' not found", "restore without a filename", prompt, baseline)
    expect_error(s, "restore", {"filename": "never-saved"}, 400, "get_manifest returned -2",
                 "restore of a missing manifest", prompt, baseline)
    # A manifest naming a chunk that is gone, then that chunk back with
    # one byte flipped. The chunk holds the state's byte two thirds in (KV
    # rows): a restore has written the rows before it into the slot when it
    # fails, and must put the slot back.
    s.save(0, "victim")
    victim = at_two_thirds(manifest_chunk_paths(store_dir, "victim"))
    with open(victim, "rb") as f:
        good = f.read()
    os.remove(victim)
    expect_error(s, "restore", {"filename": "victim"}, 500, "returned -2", "restore of a manifest naming a missing chunk",
                 prompt, baseline)
    with open(victim, "wb") as f:
        f.write(bytes([good[0] ^ 0xFF]) + good[1:])
    expect_error(s, "restore", {"filename": "victim"}, 500, "does not match its manifest entry",
                 "restore of a corrupted chunk", prompt, baseline)
    with open(victim, "wb") as f:
        f.write(good)
    s.restore(0, "victim")
    check(cached_prompt_n(s, prompt) == baseline, "the repaired store restores")
    # Another conversation's state failing part way into the occupied slot:
    # its rows were written into the slot, so the slot's own rows, not only
    # its tokens, must be put back: the same answer, tokens and
    # probabilities, from the same cached prompt.
    s.complete(tokens(21, 200), n_predict=1)
    s.save(0, "other")
    s.complete(prompt, n_predict=1)
    before = s.complete(prompt, n_predict=4)
    shared = set(manifest_chunk_paths(store_dir, "victim"))
    own = [c for c in manifest_chunk_paths(store_dir, "other") if c not in shared]
    check(len(own) > 2, f"the other conversation's own chunks: {len(own)}")
    broken = at_two_thirds(own)
    with open(broken, "rb") as f:
        good = f.read()
    with open(broken, "wb") as f:
        f.write(bytes([good[0] ^ 0xFF]) + good[1:])
    status, j = s.slot_action(0, "restore", {"filename": "other"})
    check(status == 500 and "does not match its manifest entry" in json.dumps(j),
          f"restore of another conversation with a corrupted chunk: {status} {j}")
    after = s.complete(prompt, n_predict=4)
    check(answer(after) == answer(before) and after["timings"]["prompt_n"] == before["timings"]["prompt_n"],
          f"the slot was not put back: prompt_n {after['timings']['prompt_n']} "
          f"(before {before['timings']['prompt_n']}), the same answer: {answer(after) == answer(before)}")
    log(f"ok  restore of another conversation failing part way: HTTP {status}; the slot's rows put back "
        f"(the same tokens and probabilities, prompt_n {after['timings']['prompt_n']})")
    s.stop()

    # A store that returns -6: the Redis server is gone.
    r = Server("wasm://redis/bad", work, env=env, name="redis-gone")
    r.complete(prompt, n_predict=1)
    r.save(0, "before")
    rbase = cached_prompt_n(r, prompt)
    redis.stop()
    expect_error(r, "save", {"filename": "after"}, 503, "returned -6", "save with Redis killed", prompt, rbase)
    expect_error(r, "restore", {"filename": "before"}, 503, "returned -6", "restore with Redis killed", prompt, rbase)
    r.stop()

    # A guest that traps.
    if not HOSTILE:
        log("--  no KVWASM_HOSTILE_GUEST: the trapping guest's case is skipped")
        return
    h = Server("wasm://hostile/ns", work, env=env, name="hostile")
    h.complete(prompt, n_predict=1)
    hbase = cached_prompt_n(h, prompt)
    expect_error(h, "restore", {"filename": "panic"}, 500, "returned -7", "restore through a guest that traps",
                 prompt, hbase)
    h.stop()


def start_up_errors(work, env):
    for uri, text in (("nosuch://x", "libkv_store_nosuch.so"), ("wasm://undefined-backend/ns", "could not open")):
        p = subprocess.run(
            [SERVER, "-m", MODEL, "--port", str(free_port()), "--host", "127.0.0.1", "--slot-save-path", uri],
            env=dict(os.environ, **env), capture_output=True, text=True, timeout=300,
        )
        check(p.returncode != 0 and text in p.stderr, f"start-up with {uri}: {p.returncode}\n{p.stderr[-2000:]}")
        log(f"ok  --slot-save-path {uri}: exits {p.returncode} at start-up, naming '{text}'")


def write_config(work, redis, lib, extra=""):
    path = os.path.join(work, "kvwasm.toml")
    with open(path, "w") as f:
        f.write(extra)
        f.write(
            f'[backends.redis]\ncomponent = "builtin:redis"\nnet = ["127.0.0.1:{redis.port}"]\n'
            f'env = ["KVWASM_LLAMA_REDIS_PASSWORD"]\n'
            f'[backends.redis.settings]\naddress = "127.0.0.1:{redis.port}"\n'
            f'password_env = "KVWASM_LLAMA_REDIS_PASSWORD"\ntimeout_ms = 2000\n'
        )
        if HOSTILE:
            f.write(f'[backends.hostile]\ncomponent = "{HOSTILE}"\ndir = "{work}/hostile"\n')
    return {
        "KVWASM_CONFIG": path,
        "KVWASM_LLAMA_REDIS_PASSWORD": redis.password,
        "KV_STORE_LIBRARY_PATH": lib,
    }


def lib_dir(work, shim_dir=None, name="lib"):
    """One directory holding both backends: KV_STORE_LIBRARY_PATH names one."""
    lib = os.path.join(work, name)
    os.makedirs(lib)
    os.symlink(os.path.join(shim_dir or SHIM_DIR, "libkv_store_wasm.so"), os.path.join(lib, "libkv_store_wasm.so"))
    if NATIVE_DIR:
        os.symlink(os.path.join(NATIVE_DIR, "libkv_store_cfs.so"), os.path.join(lib, "libkv_store_cfs.so"))
    return lib


def tests(work):
    redis = Redis(work)
    env = write_config(work, redis, lib_dir(work))
    os.makedirs(os.path.join(work, "plain"))
    start_up_errors(work, env)
    ref = reference(work)
    fs, cfs, shared = (os.path.join(work, d) for d in ("fs", "cfs", "shared"))
    restart_roundtrip(work, f"wasm://{fs}", f"wasm://{fs}", env, ref, "fs guest")
    restart_roundtrip(work, "wasm://redis/llama", "wasm://redis/llama", env, ref, "redis")
    restart_roundtrip(work, f"cfs://{cfs}", f"cfs://{cfs}", env, ref, "native")
    # One store, two backends: the fs guest and the native backend share a layout.
    restart_roundtrip(work, f"wasm://{shared}", f"cfs://{shared}", env, ref,
                      "saved by the fs guest, restored by the native backend")
    restart_roundtrip(work, f"cfs://{shared}/n", f"wasm://{shared}/n", env, ref,
                      "saved by the native backend, restored by the fs guest")
    ten_slots(work, env)
    bad_cases(work, env, redis)
    print("llama-server-e2e: OK", flush=True)


def sync_ms(directory, name):
    """fdatasync of a file the server wrote, then fsync of its directory:
    what upstream's save would add to be as durable as kvwasm's default."""
    t = time.perf_counter()
    fd = os.open(os.path.join(directory, name), os.O_RDONLY)
    try:
        os.fdatasync(fd)
    finally:
        os.close(fd)
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    return (time.perf_counter() - t) * 1000


def median(xs):
    return sorted(xs)[len(xs) // 2]


def bench(work):
    """Upstream's slot files against the fs guest (synced, and as a cache:
    durability = "none") and Redis, same disk,
    same run: cold saves (new prompts), warm saves (the next turn of a
    conversation already saved) and restores, as llama-server times them.
    Each save and restore starts with nothing dirty in the page cache
    (`os.sync()`, untimed), so no side pays for writing back another's
    files."""
    base = tempfile.mkdtemp(prefix="llama-server-bench.", dir=os.environ.get("KVWASM_BENCH_DIR") or None)
    redis = Redis(work)
    # The fs guest as a cache: nothing synced, as upstream's files are not.
    def fs_cache(name):
        return f'[backends.{name}]\ncomponent = "builtin:fs"\ndir = "{base}/{name}"\nsettings = {{ durability = "none" }}\n'

    baseline = os.environ.get("KVWASM_BENCH_BASELINE")
    baseline_shim = os.environ.get("KVWASM_BENCH_BASELINE_SHIM_DIR")
    cache = fs_cache("fscache") + (fs_cache("fscache-baseline") if baseline or baseline_shim else "")
    env = write_config(work, redis, lib_dir(work), cache)
    baseline_env = dict(env, KV_STORE_LIBRARY_PATH=lib_dir(work, baseline_shim, "baseline-lib")) \
        if baseline_shim else env
    files = os.path.join(base, "files")
    os.makedirs(files)
    sides = {
        "upstream files": Server(files, work, n_ctx=4096, threads=2, env=env, name="bench-files"),
        "kvwasm fs": Server(f"wasm://{base}/kv", work, n_ctx=4096, threads=2, env=env, name="bench-fs"),
        "kvwasm fs, durability none": Server("wasm://fscache/bench", work, n_ctx=4096, threads=2, env=env,
                                             name="bench-fscache"),
        "kvwasm redis": Server("wasm://redis/bench", work, n_ctx=4096, threads=2, env=env, name="bench-redis"),
    }
    if baseline or baseline_shim:
        # the fs sides again, through another build of llama-server or of
        # the shim, same run
        sides["baseline: kvwasm fs"] = Server(f"wasm://{base}/kv-baseline", work, n_ctx=4096, threads=2,
                                              env=baseline_env, name="bench-fs-baseline", server=baseline)
        sides["baseline: kvwasm fs, durability none"] = Server(
            "wasm://fscache-baseline/bench", work, n_ctx=4096, threads=2, env=baseline_env,
            name="bench-fscache-baseline", server=baseline)
    times = {k: {"cold": [], "warm": [], "restore": [], "restore empty": []} for k in sides}
    # upstream's saves made as durable as kvwasm's default (ordered): each
    # file and its directory synced once the server has written it
    synced = {"cold": [], "warm": []}
    state = {}
    try:
        for rep in range(int(os.environ.get("KVWASM_BENCH_REPS", "3"))):
            prompt = tokens(1000 + rep, 3000)
            for name, s in sides.items():
                first = s.complete(prompt, n_predict=2)
                os.sync()
                j = s.save(0, f"cold{rep}")
                times[name]["cold"].append(j["timings"]["save_ms"])
                if name == "upstream files":
                    synced["cold"].append(j["timings"]["save_ms"] + sync_ms(files, f"cold{rep}"))
                state[name] = j
                s.complete(prompt + first["tokens"] + tokens(2000 + rep, 64), n_predict=2)
                os.sync()
                j = s.save(0, f"warm{rep}")
                times[name]["warm"].append(j["timings"]["save_ms"])
                if name == "upstream files":
                    synced["warm"].append(j["timings"]["save_ms"] + sync_ms(files, f"warm{rep}"))
                # into the slot holding the conversation, then into an empty
                # one (as after a restart)
                os.sync()
                j = s.restore(0, f"cold{rep}")
                times[name]["restore"].append(j["timings"]["restore_ms"])
                status, j = s.slot_action(0, "erase", {})
                check(status == 200, f"erase: {status} {j}")
                os.sync()
                j = s.restore(0, f"cold{rep}")
                times[name]["restore empty"].append(j["timings"]["restore_ms"])
                log(f"rep {rep} {name}: " + ", ".join(f"{k} {v[-1]:.1f} ms" for k, v in times[name].items()))
    finally:
        for s in sides.values():
            s.stop()
        redis.stop()
    if os.environ.get("KV_SLOT_TRACE"):
        # kv_slot's lines (where each save's and restore's time went), per side
        for name, s in sides.items():
            with open(s.log_path) as f:
                for line in f:
                    if line.startswith("kv_slot: "):
                        print(f"{name}: {line.rstrip()}")
    up = {k: median(v) for k, v in times["upstream files"].items()}
    print(f"state: {state['kvwasm fs']['n_saved']} tokens, {state['kvwasm fs']['n_written']} bytes, "
          f"{state['kvwasm fs']['n_chunks']} chunks; upstream's file {state['upstream files']['n_written']} bytes")
    print("| side | cold save ms | warm save ms | restore ms: into an occupied slot / an empty one "
          "| cold vs upstream | warm: upstream / this | restore vs upstream: occupied / empty |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for name in sides:
        m = {k: median(v) for k, v in times[name].items()}
        print(f"| {name} | {m['cold']:.1f} | {m['warm']:.1f} | {m['restore']:.1f} / {m['restore empty']:.1f} "
              f"| {m['cold'] / up['cold']:.2f}x | {up['warm'] / m['warm']:.1f}x "
              f"| {m['restore'] / up['restore']:.2f}x / {m['restore empty'] / up['restore empty']:.2f}x |")
    up_synced = {k: median(v) for k, v in synced.items()}
    fs = {k: median(times["kvwasm fs"][k]) for k in ("cold", "warm")}
    print(f"| upstream files, then synced (file and directory) | {up_synced['cold']:.1f} | {up_synced['warm']:.1f} "
          f"| | kvwasm fs (ordered): {fs['cold'] / up_synced['cold']:.2f}x "
          f"| kvwasm fs (ordered): {up_synced['warm'] / fs['warm']:.1f}x | |")
    shutil.rmtree(base, ignore_errors=True)


def main():
    work = tempfile.mkdtemp(prefix="llama-server-e2e.")
    try:
        if sys.argv[1:] == ["--bench"]:
            bench(work)
        else:
            tests(work)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
