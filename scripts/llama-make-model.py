#!/usr/bin/env python3
"""Writes a tiny llama-architecture GGUF with random weights (fixed seed).

    llama-make-model.py [--bench] OUT.gguf

4 layers, n_embd 64, 4 heads (2 KV heads, head size 16), n_ff 128, a
259-token SentencePiece-style vocabulary (3 specials + 256 byte tokens),
F16 matrices and F32 norms: about 400 KB. The weights come from a
splitmix64 stream computed here (not numpy's generators, whose output may
change between numpy releases), so the file's bytes depend only on this
script and the pinned `gguf` package; scripts/llama-e2e.sh checks its sha256.

--bench writes the benchmark's model instead (scripts/llama-e2e.sh --bench):
16 layers, n_embd 512, 8 heads and 8 KV heads (head size 64, so K and V rows
of 1 KiB per cell and layer: 32 KiB of state per token), n_ff 1024, a
4096-token context; about 80 MB.
"""

import sys

import gguf
import numpy as np

SEED = 0x6B76_7761_736D  # "kvwasm"
N_VOCAB = 259
N_EMBD = 64
N_HEAD = 4
N_HEAD_KV = 2
N_LAYER = 4
N_FF = 128
N_CTX_TRAIN = 1024
# --bench: (N_EMBD, N_HEAD, N_HEAD_KV, N_LAYER, N_FF, N_CTX_TRAIN)
BENCH = (512, 8, 8, 16, 1024, 4096)

_MASK = np.uint64(0xFFFF_FFFF_FFFF_FFFF)


def splitmix64(x: np.ndarray) -> np.ndarray:
    """The splitmix64 finalizer, element-wise on uint64 (wrapping)."""
    with np.errstate(over="ignore"):
        x = (x + np.uint64(0x9E37_79B9_7F4A_7C15)) & _MASK
        x = ((x ^ (x >> np.uint64(30))) * np.uint64(0xBF58_476D_1CE4_E5B9)) & _MASK
        x = ((x ^ (x >> np.uint64(27))) * np.uint64(0x94D0_49BB_1331_11EB)) & _MASK
        return x ^ (x >> np.uint64(31))


class Stream:
    """Uniform values in [-scale, scale), drawn in order from one counter."""

    def __init__(self, seed: int):
        self.seed = np.uint64(seed)
        self.counter = 0

    def uniform(self, shape, scale: float) -> np.ndarray:
        n = int(np.prod(shape))
        idx = np.arange(self.counter, self.counter + n, dtype=np.uint64)
        self.counter += n
        bits = splitmix64(idx ^ self.seed) >> np.uint64(40)  # 24 random bits
        unit = bits.astype(np.float64) / float(1 << 24)
        return ((unit * 2.0 - 1.0) * scale).astype(np.float32).reshape(shape)


def main() -> None:
    global N_EMBD, N_HEAD, N_HEAD_KV, N_LAYER, N_FF, N_CTX_TRAIN
    args = sys.argv[1:]
    bench = args[:1] == ["--bench"]
    if bench:
        args = args[1:]
        N_EMBD, N_HEAD, N_HEAD_KV, N_LAYER, N_FF, N_CTX_TRAIN = BENCH
    if len(args) != 1:
        sys.exit("usage: llama-make-model.py [--bench] OUT.gguf")
    rng = Stream(SEED)
    head_dim = N_EMBD // N_HEAD
    n_embd_kv = head_dim * N_HEAD_KV

    w = gguf.GGUFWriter(args[0], "llama")
    w.add_name("kvwasm-bench-random" if bench else "kvwasm-tiny-random")
    w.add_context_length(N_CTX_TRAIN)
    w.add_embedding_length(N_EMBD)
    w.add_block_count(N_LAYER)
    w.add_feed_forward_length(N_FF)
    w.add_head_count(N_HEAD)
    w.add_head_count_kv(N_HEAD_KV)
    w.add_rope_dimension_count(head_dim)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16)

    tokens = [b"<unk>", b"<s>", b"</s>"] + [f"<0x{b:02X}>".encode() for b in range(256)]
    types = [gguf.TokenType.UNKNOWN, gguf.TokenType.CONTROL, gguf.TokenType.CONTROL]
    types += [gguf.TokenType.BYTE] * 256
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores([0.0] * len(tokens))
    w.add_token_types(types)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)

    def matrix(name: str, rows: int, cols: int) -> None:
        # numpy shape (rows, cols) = ggml ne (cols, rows): rows outputs of cols inputs.
        w.add_tensor(name, rng.uniform((rows, cols), 1.0 / np.sqrt(cols)).astype(np.float16))

    def norm(name: str) -> None:
        w.add_tensor(name, (1.0 + rng.uniform((N_EMBD,), 0.1)).astype(np.float32))

    matrix("token_embd.weight", N_VOCAB, N_EMBD)
    for i in range(N_LAYER):
        norm(f"blk.{i}.attn_norm.weight")
        matrix(f"blk.{i}.attn_q.weight", N_EMBD, N_EMBD)
        matrix(f"blk.{i}.attn_k.weight", n_embd_kv, N_EMBD)
        matrix(f"blk.{i}.attn_v.weight", n_embd_kv, N_EMBD)
        matrix(f"blk.{i}.attn_output.weight", N_EMBD, N_EMBD)
        norm(f"blk.{i}.ffn_norm.weight")
        matrix(f"blk.{i}.ffn_gate.weight", N_FF, N_EMBD)
        matrix(f"blk.{i}.ffn_up.weight", N_FF, N_EMBD)
        matrix(f"blk.{i}.ffn_down.weight", N_EMBD, N_FF)
    norm("output_norm.weight")
    matrix("output.weight", N_VOCAB, N_EMBD)

    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


if __name__ == "__main__":
    main()
