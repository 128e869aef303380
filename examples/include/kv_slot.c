/* kv_slot: see kv_slot.h; the chunking and the manifest are described in
 * docs/llama.md. */
#define _GNU_SOURCE /* MADV_HUGEPAGE */
#include "kv_slot.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#define XXH_INLINE_ALL
#include "xxhash.h"

#define MANIFEST_MAGIC 0x534c564bu /* "KVLS" little-endian */
#define MANIFEST_VERSION 1u
#define MANIFEST_HEAD 24 /* magic, version, rows per chunk, chunk count, state bytes */
#define MANIFEST_ENTRY (KV_SLOT_HASH_LEN + 4)
#define SEQ_IO_MAGIC 0xaf143cd8u /* first word of llama_state_seq_get_data */
#define FIXED_SPAN (1u << 20)    /* chunk size of a state whose layout is not recognised */

static void put_u32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static void put_u64(uint8_t *p, uint64_t v) {
    for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static uint32_t get_u32(const uint8_t *p) {
    uint32_t v = 0;
    for (int i = 0; i < 4; i++) v |= (uint32_t)p[i] << (8 * i);
    return v;
}
static uint64_t get_u64(const uint8_t *p) {
    uint64_t v = 0;
    for (int i = 0; i < 8; i++) v |= (uint64_t)p[i] << (8 * i);
    return v;
}

static int fail(kv_slot_error *err, int store_rc, const char *what, const char *fmt, ...) {
    err->store_rc = store_rc;
    err->what = what;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err->msg, sizeof err->msg, fmt, ap);
    va_end(ap);
    return -1;
}

const char *kv_slot_rc_meaning(int rc) {
    switch (rc) {
    case -1: return "backend or host error";
    case -2: return "not found";
    case -3: return "the backend refused an argument";
    case -4: return "denied";
    case -5: return "storage I/O error";
    case -6: return "a remote service is unavailable";
    case -7: return "the guest trapped";
    case -8: return "the call exceeded its deadline";
    case -9: return "a host limit refused the call";
    case -10: return "bad input at the C boundary";
    default: return "backend failure";
    }
}

void kv_slot_write_head(uint8_t *out, uint32_t magic, uint32_t version, const int32_t *tokens, size_t n_tokens) {
    put_u32(out, magic);
    put_u32(out + 4, version);
    put_u32(out + 8, (uint32_t)n_tokens);
    for (size_t i = 0; i < n_tokens; i++) put_u32(out + KV_SLOT_GGSQ_HEAD + 4 * i, (uint32_t)tokens[i]);
}

uint8_t *kv_slot_buf_reserve(kv_slot_buf *buf, size_t size) {
    if (size <= buf->cap && buf->data) return buf->data;
    kv_slot_buf_release(buf);
    size_t cap = (size + (2u << 20) - 1) & ~(size_t)((2u << 20) - 1); /* whole huge pages */
    if (cap < size) return NULL;
    void *p = mmap(NULL, cap, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return NULL;
#ifdef MADV_HUGEPAGE
    madvise(p, cap, MADV_HUGEPAGE); /* a hint: without it, 4 KiB pages */
#endif
    buf->data = (uint8_t *)p;
    buf->cap = cap;
    return buf->data;
}

void kv_slot_buf_release(kv_slot_buf *buf) {
    if (buf->data) munmap(buf->data, buf->cap);
    buf->data = NULL;
    buf->cap = 0;
}

/* ---- chunking ---- */

typedef struct {
    size_t off, len;
} span;

typedef struct {
    span *s;
    size_t n, cap;
} spans;

static void push(spans *v, size_t off, size_t len) {
    if (v->n == v->cap) {
        v->cap = v->cap ? 2 * v->cap : 256;
        span *grown = (span *)realloc(v->s, v->cap * sizeof *grown);
        if (!grown) abort();
        v->s = grown;
    }
    v->s[v->n++] = (span){off, len};
}

/* Cuts along the KV rows: everything before a row region (the ggsq header
 * with the tokens, the io header, each non-empty stream's cell metadata
 * and data header) is a span of its own; each region (a layer's K, or V)
 * is cut every `rows` rows, its 12-byte descriptor going with its first
 * rows; what follows the last region (the cell counts of later, empty
 * streams) is the last span. Rows are cells in position order, so two
 * states sharing a prompt prefix share every span inside it, whichever
 * stream (slot) they come from. 0 unless the layout accounts for every
 * byte. */
static int cut_rows(const uint8_t *st, size_t size, uint32_t rows, spans *out) {
    size_t o, glue = 0;
#define NEED(k)                                    \
    do {                                           \
        if ((k) > size || o > size - (k)) return 0; \
    } while (0)
    o = 0;
    NEED(KV_SLOT_GGSQ_HEAD);
    o = KV_SLOT_GGSQ_HEAD;
    NEED(4 * (size_t)get_u32(st + 8));
    o += 4 * (size_t)get_u32(st + 8);
    NEED(12); /* io magic, sequence id, stream count */
    if (get_u32(st + o) != SEQ_IO_MAGIC) return 0;
    uint32_t n_stream = get_u32(st + o + 8);
    o += 12;
    for (uint32_t s = 0; s < n_stream; s++) {
        NEED(4);
        uint32_t n_cell = get_u32(st + o);
        o += 4;
        if (n_cell == 0) continue;
        for (uint32_t c = 0; c < n_cell; c++) { /* pos, n_seq_id, seq ids */
            NEED(8);
            size_t n_seq = get_u32(st + o + 4);
            o += 8;
            NEED(4 * n_seq);
            o += 4 * n_seq;
        }
        NEED(16); /* v_trans, n_layer, n_rot_k, n_rot_v */
        uint32_t v_trans = get_u32(st + o), n_layer = get_u32(st + o + 4);
        o += 16;
        for (uint32_t r = 0; r < 2 * n_layer; r++) {
            /* K rows of each layer, then V: one row per cell, or, with a
             * transposed V, one row per embedding element across the cells */
            int transposed = v_trans && r >= n_layer;
            NEED(12);
            size_t row = transposed ? (size_t)get_u32(st + o + 4) * n_cell : (size_t)get_u64(st + o + 4);
            size_t n_row = transposed ? get_u32(st + o + 8) : n_cell;
            if (o > glue) push(out, glue, o - glue);
            size_t start = o;
            o += 12;
            for (size_t c = 0; c < n_row; c += rows) {
                size_t k = (n_row - c < rows ? n_row - c : rows);
                if (row && k > (size_t)-1 / row) return 0;
                NEED(k * row);
                o += k * row;
                push(out, start, o - start);
                start = o;
            }
            if (n_row == 0) push(out, start, o - start);
            glue = o;
        }
    }
#undef NEED
    if (o != size) return 0;
    if (size > glue) push(out, glue, size - glue);
    return 1;
}

static void cut(const uint8_t *st, size_t size, uint32_t rows, spans *out, int *rows_layout) {
    *rows_layout = rows > 0 && cut_rows(st, size, rows, out);
    if (*rows_layout) return;
    out->n = 0;
    for (size_t o = 0; o < size; o += FIXED_SPAN) push(out, o, size - o < FIXED_SPAN ? size - o : FIXED_SPAN);
}

static void key_of(const uint8_t *data, size_t len, uint8_t key[KV_SLOT_HASH_LEN]) {
    put_u64(key, XXH3_64bits(data, len));
}

int kv_slot_save(const kv_store_vtable *vt, kv_store_v1 *store, const char *name, const uint8_t *state, size_t size,
                 uint32_t rows, kv_slot_save_stats *stats, kv_slot_error *err) {
    memset(stats, 0, sizeof *stats);
    spans sp = {NULL, 0, 0};
    cut(state, size, rows, &sp, &stats->rows_layout);
    size_t mlen = MANIFEST_HEAD + sp.n * MANIFEST_ENTRY;
    uint8_t *m = (uint8_t *)malloc(mlen);
    if (!m) abort();
    put_u32(m, MANIFEST_MAGIC);
    put_u32(m + 4, MANIFEST_VERSION);
    put_u32(m + 8, stats->rows_layout ? rows : 0);
    put_u32(m + 12, (uint32_t)sp.n);
    put_u64(m + 16, size);
    int result = 0;
    for (size_t i = 0; i < sp.n && result == 0; i++) {
        uint8_t *e = m + MANIFEST_HEAD + i * MANIFEST_ENTRY;
        key_of(state + sp.s[i].off, sp.s[i].len, e);
        put_u32(e + KV_SLOT_HASH_LEN, (uint32_t)sp.s[i].len);
        int rc = vt->put_chunk(store, e, KV_SLOT_HASH_LEN, state + sp.s[i].off, sp.s[i].len);
        if (rc < 0) {
            result = fail(err, rc, "put_chunk", "put_chunk of chunk %zu of %zu returned %d: %s", i, sp.n, rc,
                          kv_slot_rc_meaning(rc));
        } else if (rc == 1) {
            stats->deduplicated++;
        } else {
            stats->stored++;
            stats->bytes_stored += sp.s[i].len;
        }
    }
    if (result == 0) {
        int rc = vt->put_manifest(store, name, m, mlen);
        if (rc < 0)
            result = fail(err, rc, "put_manifest", "put_manifest returned %d: %s", rc, kv_slot_rc_meaning(rc));
    }
    stats->chunks = sp.n;
    free(m);
    free(sp.s);
    return result;
}

int kv_slot_load(const kv_store_vtable *vt, kv_store_v1 *store, const char *name, kv_slot_buf *state, size_t *size,
                 size_t *chunks, kv_slot_error *err) {
    uint8_t *m = NULL;
    size_t mlen = 0;
    int rc = vt->get_manifest(store, name, &m, &mlen);
    if (rc < 0)
        return fail(err, rc, "get_manifest", "get_manifest returned %d: %s", rc, kv_slot_rc_meaning(rc));
    if (mlen < MANIFEST_HEAD || get_u32(m) != MANIFEST_MAGIC || get_u32(m + 4) != MANIFEST_VERSION) {
        free(m);
        return fail(err, 0, "manifest", "not a kv_slot manifest (%zu bytes)", mlen);
    }
    size_t n = get_u32(m + 12);
    uint64_t total = get_u64(m + 16);
    if (mlen != MANIFEST_HEAD + n * MANIFEST_ENTRY || total > SIZE_MAX) {
        free(m);
        return fail(err, 0, "manifest", "the manifest's length (%zu bytes) does not match its %zu chunks", mlen, n);
    }
    uint8_t *keys = (uint8_t *)malloc(n ? n * KV_SLOT_HASH_LEN : 1);
    if (!keys) abort();
    uint64_t sum = 0;
    for (size_t i = 0; i < n; i++) {
        memcpy(keys + i * KV_SLOT_HASH_LEN, m + MANIFEST_HEAD + i * MANIFEST_ENTRY, KV_SLOT_HASH_LEN);
        sum += get_u32(m + MANIFEST_HEAD + i * MANIFEST_ENTRY + KV_SLOT_HASH_LEN);
    }
    if (sum != total) {
        free(keys);
        free(m);
        return fail(err, 0, "manifest", "the manifest's chunks hold %llu bytes, its header says %llu",
                    (unsigned long long)sum, (unsigned long long)total);
    }
    /* A hint: a failure leaves the per-chunk gets to do the work. */
    if (vt->version >= 2 && vt->prefetch_chunks && n) vt->prefetch_chunks(store, keys, KV_SLOT_HASH_LEN, n);
    free(keys);
    uint8_t *st = kv_slot_buf_reserve(state, total ? (size_t)total : 1);
    if (!st) {
        free(m);
        return fail(err, 0, "memory", "no memory for a state of %llu bytes", (unsigned long long)total);
    }
    size_t o = 0;
    int result = 0;
    for (size_t i = 0; i < n && result == 0; i++) {
        const uint8_t *e = m + MANIFEST_HEAD + i * MANIFEST_ENTRY;
        uint8_t *data = NULL, key[KV_SLOT_HASH_LEN];
        size_t len = 0, want = get_u32(e + KV_SLOT_HASH_LEN);
        rc = vt->get_chunk(store, e, KV_SLOT_HASH_LEN, &data, &len);
        if (rc < 0) {
            result = fail(err, rc, "get_chunk", "get_chunk of chunk %zu of %zu (%016llx) returned %d: %s", i, n,
                          (unsigned long long)get_u64(e), rc, kv_slot_rc_meaning(rc));
            break;
        }
        if (len == want) key_of(data, len, key);
        if (len != want || memcmp(key, e, KV_SLOT_HASH_LEN) != 0) {
            result = fail(err, 0, "get_chunk", "chunk %zu of %zu (%016llx) does not match its manifest entry (%s)", i,
                          n, (unsigned long long)get_u64(e), len != want ? "length" : "xxh3-64");
        } else {
            memcpy(st + o, data, len); /* still in cache from the hash */
            o += len;
        }
        free(data); /* backend outputs come from malloc */
    }
    free(m);
    if (result != 0) return result;
    *size = (size_t)total;
    *chunks = n;
    return 0;
}
