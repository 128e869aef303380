/* kv_slot: a llama.cpp sequence state saved into a kv_store_v1 backend as
 * content-addressed xxh3-64 chunks plus a small manifest, and loaded back.
 * One source shared by examples/llama-slot (a libllama program) and the
 * llama-server patch (examples/llama-server); docs/llama.md describes the
 * chunking and the manifest.
 *
 * A "state" here is what llama_state_seq_save_file would write, with
 * llama_state_seq_get_data's own io header: the ggsq header (magic, version,
 * token count, tokens) followed by llama_state_seq_get_data(ctx, ..., seq). */
#ifndef KV_SLOT_H
#define KV_SLOT_H

#include <stddef.h>
#include <stdint.h>

#include "kv_store_abi.h"

#ifdef __cplusplus
extern "C" {
#endif

#define KV_SLOT_HASH_LEN 8
#define KV_SLOT_GGSQ_HEAD 12 /* magic, version, token count */

/* What went wrong, for a log line or an HTTP answer. `store_rc` is the
 * backend's negative return when the store failed (0 otherwise: a format
 * or integrity failure); `what` names the call that failed. */
typedef struct {
    int store_rc;
    const char *what;
    char msg[512];
} kv_slot_error;

typedef struct {
    size_t chunks;       /* chunks in the manifest */
    size_t stored;       /* put_chunk returned 0 */
    size_t deduplicated; /* put_chunk returned 1: already stored */
    size_t bytes_stored; /* bytes of the stored chunks */
    int rows_layout;     /* 1: cut along KV rows; 0: the layout was not recognised, cut every 1 MiB */
} kv_slot_save_stats;

/* A buffer for a whole state, kept from one save or restore to the next.
 * A fresh buffer of ~100 MB costs a page fault (and the zeroing of a page)
 * per 4 KiB on first touch, which took longer than writing the same bytes
 * to a file (docs/llama.md); a kept one costs nothing after its first use.
 * It is mapped with transparent huge pages where the kernel offers them. */
typedef struct {
    uint8_t *data;
    size_t cap;
} kv_slot_buf;

/* At least `size` bytes at buf->data (its contents are not to be relied
 * on after it grows); NULL if memory is short (the buffer is then empty). */
uint8_t *kv_slot_buf_reserve(kv_slot_buf *buf, size_t size);

/* Unmaps the buffer; it may be reserved again. */
void kv_slot_buf_release(kv_slot_buf *buf);

/* Writes the ggsq header for `n_tokens` tokens (KV_SLOT_GGSQ_HEAD + 4 * n
 * bytes at `out`). */
void kv_slot_write_head(uint8_t *out, uint32_t magic, uint32_t version, const int32_t *tokens, size_t n_tokens);

/* Saves `state` (`size` bytes) under manifest `name`: its chunks, `rows`
 * KV rows (cells) each, every one put_chunk'd under its xxh3-64, then the
 * manifest. A helper thread hashes while the caller's thread calls the
 * backend (only ever that thread). 0 on success; -1 with `err` filled. */
int kv_slot_save(const kv_store_vtable *vt, kv_store_v1 *store, const char *name, const uint8_t *state, size_t size,
                 uint32_t rows, kv_slot_save_stats *stats, kv_slot_error *err);

/* A state in pieces, in order, as llama_state_seq_get_data_cb hands it
 * out: pieces that stay valid until the save (tensor memory) are kept by
 * pointer, the others copied (consecutive ones into one run). Saving it
 * gives the same chunks, hashes and manifest as saving the contiguous
 * state; only a chunk that spans pieces is copied. Kept from one save to
 * the next (kv_slot_pieces_clear), freed by kv_slot_pieces_free. */
typedef struct {
    struct kv_slot_piece *piece;
    size_t n, cap;
    uint8_t *copied; /* the copied pieces' bytes */
    size_t copied_len, copied_cap;
    size_t size; /* bytes of all pieces */
} kv_slot_pieces;

/* Appends `len` bytes; `stable`: `data` stays valid until the save, else
 * it is copied now. 0, or -1 if memory is short. */
int kv_slot_pieces_add(kv_slot_pieces *p, const void *data, size_t len, int stable);
void kv_slot_pieces_clear(kv_slot_pieces *p);
void kv_slot_pieces_free(kv_slot_pieces *p);

/* kv_slot_save of a state in pieces. */
int kv_slot_save_pieces(const kv_store_vtable *vt, kv_store_v1 *store, const char *name, const kv_slot_pieces *state,
                        uint32_t rows, kv_slot_save_stats *stats, kv_slot_error *err);

/* Loads manifest `name` and its chunks (prefetch_chunks first on a v2
 * vtable), checking each chunk's length and xxh3-64 against the manifest,
 * into `state` (grown as needed): a kv_slot_reader read whole. On success
 * returns 0, state->data holding `*size` bytes and `*chunks` the chunk
 * count; -1 with `err` filled otherwise (the buffer's contents are then
 * undefined). */
int kv_slot_load(const kv_store_vtable *vt, kv_store_v1 *store, const char *name, kv_slot_buf *state, size_t *size,
                 size_t *chunks, kv_slot_error *err);

/* An optional call a backend library may export beside its vtable:
 * libkv_store_wasm.so's `kv_store_wasm_get_chunk_into` (look it up with
 * dlsym; other backends have none). It writes the chunk into the caller's
 * `buf` of `cap` bytes, no malloc'd block: 0 with `*out_len` its length;
 * a negative code as get_chunk's otherwise, and KV_SLOT_INTO_TOO_SMALL
 * with `*out_len` > `cap` (the chunk's length) when it does not fit. */
typedef int (*kv_slot_get_chunk_into_fn)(kv_store_v1 *store, const uint8_t *hash, size_t hash_len, uint8_t *buf,
                                         size_t cap, size_t *out_len);
#define KV_SLOT_GET_CHUNK_INTO_SYMBOL "kv_store_wasm_get_chunk_into"
#define KV_SLOT_INTO_TOO_SMALL (-10)

/* kv_slot_load, each chunk fetched with `get_into` (when not NULL) straight
 * into its place in `state`: no block per chunk to allocate, copy and free.
 * The same checks, failures and result. */
int kv_slot_load_into(const kv_store_vtable *vt, kv_slot_get_chunk_into_fn get_into, kv_store_v1 *store,
                      const char *name, kv_slot_buf *state, size_t *size, size_t *chunks, kv_slot_error *err);

/* A state read in order, straight into the reader's memory: a chunk that
 * lies wholly inside one read is fetched there (with `get_into` when not
 * NULL) by the caller's thread and a helper, then checked (length,
 * xxh3-64); bytes of a chunk a read covers in part are checked before they
 * are handed out. A read that fails may have written checked and unchecked
 * bytes into its buffer: the caller must not use them. */
typedef struct kv_slot_reader kv_slot_reader;

/* Fetches manifest `name` and starts the helper, which sends
 * prefetch_chunks on a v2 vtable. 0 with `*reader` set, to be closed; -1
 * with `err` filled (no reader). */
int kv_slot_reader_open(const kv_store_vtable *vt, kv_slot_get_chunk_into_fn get_into, kv_store_v1 *store,
                        const char *name, kv_slot_reader **reader, kv_slot_error *err);

/* The state's size and chunk count, as its manifest says. */
size_t kv_slot_reader_size(const kv_slot_reader *reader);
size_t kv_slot_reader_chunks(const kv_slot_reader *reader);
/* Chunks fetched so far through the bounce buffer: those a read covered
 * only in part (the rest went straight into the caller's memory). */
size_t kv_slot_reader_bounced(const kv_slot_reader *reader);

/* The next `len` bytes of the state into `dst`: 0, or -1 (the reason is
 * kv_slot_reader_close's; every later read fails too). */
int kv_slot_read(kv_slot_reader *reader, void *dst, size_t len);

/* Stops the helper and frees the reader: 0 if every byte of the state was
 * read and checked, else -1 with `err` filled: the first failure in chunk
 * order, or, with `err->what` "read", a caller that read past the state's
 * end or stopped before it (the store is not at fault). */
int kv_slot_reader_close(kv_slot_reader *reader, kv_slot_error *err);

/* KV_SLOT_TRACE set (non-empty) in the environment: kv_slot_save and
 * kv_slot_load print one line each on stderr saying where their time went
 * (the callers add theirs: llama.cpp's state calls). */
int kv_slot_tracing(void);

/* A monotonic clock, in ms, for those lines. */
double kv_slot_now_ms(void);

/* What a negative return of libkv_store_wasm.so means (README, "Return
 * codes"); other backends' codes are unspecified. */
const char *kv_slot_rc_meaning(int rc);

#ifdef __cplusplus
}
#endif

#endif
