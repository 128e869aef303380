#!/usr/bin/env python3
"""A KV event publisher shaped like vLLM's and SGLang's, for the tests of
kvwasm's ZMQ event source (tests/tests/event_sources.rs, docs/events.md).

Real libzmq (pyzmq) and real msgpack: it binds a publisher socket and a
ROUTER replay socket, waits for one subscriber, publishes BATCHES messages
`[topic, seq (8 bytes big-endian), payload]` with seq 0..BATCHES-1, then
answers replay requests `[b"", start_seq]` until killed (or --serve-for
seconds). The publisher socket is an XPUB only so that it can wait for the
subscription (a plain PUB drops what it sends before one arrives); a
subscriber cannot tell the difference.

Batch k holds (hashes h(i) per --hashes: `int` i + 1000, `signed` -(i + 1),
`bytes` 24 bytes of 0xAA then i + 1000 as 8 big-endian bytes):
  - BlockStored: block_hashes [h(2k), h(2k+1)], parent h(2k-1) (none for
    k = 0), token_ids 8k..8k+7, block_size 4, medium GPU, plus an unknown
    trailing key or field;
  - for odd k, BlockRemoved [h(2k-2)], medium CPU_PINNED;
  - for the last batch, AllBlocksCleared.
--remove-from K leaves out the removals of batches before K, --no-clear
the AllBlocksCleared (a state worth querying: the prefix survives).
Shapes: `vllm-map` (tagged maps, batch rank 1), `vllm-array` (tagged
arrays, batch rank nil), `sglang` (tagged arrays, `[ts, events]`).
--drop seqs are kept for replay but never published live (a forced gap);
--garbage seqs carry a payload that is not msgpack. Replies carry the topic
(vLLM 0.33: `[b"", topic, seq, payload]`, end `[b"", b"", 0xff..ff, b""]`)
with --reply-topic, else `[b"", seq, payload]` (end: an empty payload).
Prints `ready` once bound, `published` once every batch is out, and
`replayed FROM N` after each replay.
"""

import argparse
import struct
import sys
import time

import msgpack
import zmq

END_SEQ = b"\xff" * 8


def hash_of(kind, i):
    if kind == "int":
        return i + 1000
    if kind == "signed":
        return -(i + 1)
    return b"\xaa" * 24 + struct.pack(">Q", i + 1000)


def events_of(args, k):
    h = lambda i: hash_of(args.hashes, i)
    stored = {
        "type": "BlockStored",
        "block_hashes": [h(2 * k), h(2 * k + 1)],
        "parent_block_hash": h(2 * k - 1) if k > 0 else None,
        "token_ids": list(range(8 * k, 8 * k + 8)),
        "block_size": 4,
        "lora_id": None,
        "medium": "GPU",
        "lora_name": None,
        "extra_keys": [[1, 2]],
    }
    removed = {"type": "BlockRemoved", "block_hashes": [h(2 * k - 2)], "medium": "CPU_PINNED"}
    events = [stored] + ([removed] if k % 2 == 1 and k >= args.remove_from else [])
    if k == args.batches - 1 and not args.no_clear:
        events.append({"type": "AllBlocksCleared"})
    if args.shape == "vllm-map":
        return events
    # Tagged arrays: the fields in declaration order, unknown ones trailing.
    order = {
        "BlockStored": ["block_hashes", "parent_block_hash", "token_ids", "block_size",
                        "lora_id", "medium", "lora_name", "extra_keys"],
        "BlockRemoved": ["block_hashes", "medium"],
        "AllBlocksCleared": [],
    }
    return [[e["type"]] + [e[f] for f in order[e["type"]]] for e in events]


def payload_of(args, k):
    if k in args.garbage:
        return b"\xc1\xff\x00 not msgpack"
    events = events_of(args, k)
    ts = time.time()
    batch = [ts, events] if args.shape == "sglang" else [ts, events, 1 if args.shape == "vllm-map" else None]
    return msgpack.packb(batch, use_bin_type=True)


def seqs(text):
    return {int(s) for s in text.split(",") if s}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pub", required=True)
    parser.add_argument("--replay", required=True)
    parser.add_argument("--shape", choices=["vllm-map", "vllm-array", "sglang"], required=True)
    parser.add_argument("--hashes", choices=["int", "signed", "bytes"], default="int")
    parser.add_argument("--batches", type=int, default=8)
    parser.add_argument("--drop", type=seqs, default=set())
    parser.add_argument("--garbage", type=seqs, default=set())
    parser.add_argument("--reply-topic", action="store_true")
    parser.add_argument("--remove-from", type=int, default=0)
    parser.add_argument("--no-clear", action="store_true")
    parser.add_argument("--topic", default="kv-events")
    parser.add_argument("--serve-for", type=float, default=60.0)
    args = parser.parse_args()

    ctx = zmq.Context()
    pub = ctx.socket(zmq.XPUB)
    pub.setsockopt(zmq.LINGER, 0)
    pub.bind(args.pub)
    router = ctx.socket(zmq.ROUTER)
    router.setsockopt(zmq.LINGER, 0)
    router.bind(args.replay)
    print("ready", flush=True)

    subscription = pub.recv()
    assert subscription[:1] == b"\x01", subscription

    topic = args.topic.encode()
    sent = []
    for k in range(args.batches):
        message = (struct.pack(">Q", k), payload_of(args, k))
        sent.append(message)
        if k not in args.drop:
            pub.send_multipart([topic, *message])
    print("published", flush=True)

    deadline = time.monotonic() + args.serve_for
    while time.monotonic() < deadline:
        if not router.poll(100):
            continue
        identity, empty, start = router.recv_multipart()
        assert empty == b"", empty
        (start,) = struct.unpack(">Q", start)
        replayed = [m for m in sent if struct.unpack(">Q", m[0])[0] >= start]
        for seq, payload in replayed:
            reply = [topic, seq, payload] if args.reply_topic else [seq, payload]
            router.send_multipart([identity, b"", *reply])
        end = [b"", END_SEQ, b""] if args.reply_topic else [END_SEQ, b""]
        router.send_multipart([identity, b"", *end])
        print(f"replayed {start} {len(replayed)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
