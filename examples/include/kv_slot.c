/* kv_slot: see kv_slot.h; the chunking and the manifest are described in
 * docs/llama.md. */
#define _GNU_SOURCE /* MADV_HUGEPAGE, mremap, clock_gettime */
#include "kv_slot.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

/* xxh3 with the widest vectors the CPU has: llama.cpp builds for baseline
 * x86-64 (GGML_NATIVE=OFF), where xxhash.h alone uses SSE2, and every save
 * and restore hashes the whole state (docs/llama.md). xxhash.h's own
 * dispatch hooks (as its xxh_x86dispatch.c uses them); the same hash on
 * every path. */
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define KV_SLOT_XXH3_DISPATCH
#define XXH_X86DISPATCH /* accumulators aligned for AVX-512 */
#define XXH_DISPATCH_AVX2 1
#define XXH_DISPATCH_AVX512 1
#define XXH_TARGET_AVX2 __attribute__((__target__("avx2")))
#define XXH_TARGET_AVX512 __attribute__((__target__("avx512f")))
#endif
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
    size_t cap = (size + (2u << 20) - 1) & ~(size_t)((2u << 20) - 1); /* whole huge pages */
    if (cap < size) {
        kv_slot_buf_release(buf);
        return NULL;
    }
    /* Growing keeps the pages already touched (a slot's next turn is a
     * little larger): only the new tail faults in. */
    void *p = buf->data ? mremap(buf->data, buf->cap, cap, MREMAP_MAYMOVE)
                        : mmap(NULL, cap, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
        kv_slot_buf_release(buf);
        return NULL;
    }
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

/* ---- a state in pieces ----
 *
 * The chunking reads a state through a view: its segments in order, each
 * a run of bytes in memory. A contiguous state is one segment. */

struct kv_slot_piece {
    size_t off, len; /* where it lies in the state */
    const uint8_t *data; /* NULL: at `copied_at` in the copied bytes */
    size_t copied_at;
};

typedef struct {
    const struct kv_slot_piece *seg;
    size_t n;
    const uint8_t *copied;
    size_t size;
} view;

static const uint8_t *seg_data(const view *v, const struct kv_slot_piece *g) {
    return g->data ? g->data : v->copied + g->copied_at;
}

/* The segment holding byte `off` (< v->size). */
static size_t seg_index(const view *v, size_t off) {
    size_t lo = 0, hi = v->n; /* the answer is in [lo, hi) */
    while (hi - lo > 1) {
        size_t mid = lo + (hi - lo) / 2;
        if (v->seg[mid].off <= off)
            lo = mid;
        else
            hi = mid;
    }
    return lo;
}

/* Bytes [off, off + len) at one place in memory, or NULL if they span
 * segments. */
static const uint8_t *view_run(const view *v, size_t off, size_t len) {
    if (len == 0 || v->n == 0) return v->n ? seg_data(v, &v->seg[0]) : (const uint8_t *)"";
    const struct kv_slot_piece *g = &v->seg[seg_index(v, off)];
    return off - g->off + len <= g->len ? seg_data(v, g) + (off - g->off) : NULL;
}

/* Copies bytes [off, off + len) (inside the state) to `dst`. */
static void view_copy(const view *v, size_t off, size_t len, uint8_t *dst) {
    for (size_t i = len ? seg_index(v, off) : v->n; len; i++) {
        const struct kv_slot_piece *g = &v->seg[i];
        size_t in = off - g->off, k = g->len - in < len ? g->len - in : len;
        memcpy(dst, seg_data(v, g) + in, k);
        dst += k;
        off += k;
        len -= k;
    }
}

static uint32_t view_u32(const view *v, size_t off) {
    uint8_t b[4];
    view_copy(v, off, 4, b);
    return get_u32(b);
}

static uint64_t view_u64(const view *v, size_t off) {
    uint8_t b[8];
    view_copy(v, off, 8, b);
    return get_u64(b);
}

int kv_slot_pieces_add(kv_slot_pieces *p, const void *data, size_t len, int stable) {
    if (len == 0) return 0;
    struct kv_slot_piece *last = p->n ? &p->piece[p->n - 1] : NULL;
    if (!stable) {
        if (len > p->copied_cap - p->copied_len) {
            size_t cap = p->copied_cap ? p->copied_cap : 65536;
            while (cap - p->copied_len < len) {
                if (cap > SIZE_MAX / 2) return -1;
                cap *= 2;
            }
            uint8_t *grown = (uint8_t *)realloc(p->copied, cap);
            if (!grown) return -1;
            p->copied = grown;
            p->copied_cap = cap;
        }
        memcpy(p->copied + p->copied_len, data, len);
        if (last && !last->data && last->copied_at + last->len == p->copied_len) {
            last->len += len; /* the run of copied bytes goes on */
            p->copied_len += len;
            p->size += len;
            return 0;
        }
    }
    if (p->n == p->cap) {
        size_t cap = p->cap ? 2 * p->cap : 256;
        struct kv_slot_piece *grown = (struct kv_slot_piece *)realloc(p->piece, cap * sizeof *grown);
        if (!grown) return -1;
        p->piece = grown;
        p->cap = cap;
    }
    p->piece[p->n++] = (struct kv_slot_piece){p->size, len, stable ? (const uint8_t *)data : NULL,
                                              stable ? 0 : p->copied_len};
    if (!stable) p->copied_len += len;
    p->size += len;
    return 0;
}

void kv_slot_pieces_clear(kv_slot_pieces *p) {
    p->n = 0;
    p->copied_len = 0;
    p->size = 0;
}

void kv_slot_pieces_free(kv_slot_pieces *p) {
    free(p->piece);
    free(p->copied);
    memset(p, 0, sizeof *p);
}

/* ---- chunking ---- */

typedef struct {
    size_t off, len;
} span;

typedef struct {
    span *s;
    size_t n, cap;
} spans;

/* Adds a span; an empty one (rows of 0 bytes) is no chunk. */
static void push(spans *v, size_t off, size_t len) {
    if (len == 0) return;
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
 * and data header) is a span of its own, ending with the first region's
 * 12-byte descriptor; each later region's descriptor is a span of its own
 * (identical descriptors are one chunk); each region (a layer's K, or V) is
 * cut every `rows` rows. So every span of rows lies wholly inside the one
 * read llama.cpp makes of its region, and a restore fetches it straight
 * into the tensor (kv_slot_reader). What follows the last region (the cell
 * counts of later, empty streams) is the last span. Rows are cells in
 * position order, so two states sharing a prompt prefix share every span
 * inside it, whichever stream (slot) they come from. 0 unless the layout
 * accounts for every byte. */
static int cut_rows(const view *st, uint32_t rows, spans *out) {
    size_t size = st->size;
    size_t o, glue = 0;
#define NEED(k)                                    \
    do {                                           \
        if ((k) > size || o > size - (k)) return 0; \
    } while (0)
    o = 0;
    NEED(KV_SLOT_GGSQ_HEAD);
    o = KV_SLOT_GGSQ_HEAD;
    NEED(4 * (size_t)view_u32(st, 8));
    o += 4 * (size_t)view_u32(st, 8);
    NEED(12); /* io magic, sequence id, stream count */
    if (view_u32(st, o) != SEQ_IO_MAGIC) return 0;
    uint32_t n_stream = view_u32(st, o + 8);
    o += 12;
    for (uint32_t s = 0; s < n_stream; s++) {
        NEED(4);
        uint32_t n_cell = view_u32(st, o);
        o += 4;
        if (n_cell == 0) continue;
        for (uint32_t c = 0; c < n_cell; c++) { /* pos, n_seq_id, seq ids */
            NEED(8);
            size_t n_seq = view_u32(st, o + 4);
            o += 8;
            NEED(4 * n_seq);
            o += 4 * n_seq;
        }
        NEED(16); /* v_trans, n_layer, n_rot_k, n_rot_v */
        uint32_t v_trans = view_u32(st, o), n_layer = view_u32(st, o + 4);
        o += 16;
        for (uint32_t r = 0; r < 2 * n_layer; r++) {
            /* K rows of each layer, then V: one row per cell, or, with a
             * transposed V, one row per embedding element across the cells */
            int transposed = v_trans && r >= n_layer;
            NEED(12);
            size_t row = transposed ? (size_t)view_u32(st, o + 4) * n_cell : (size_t)view_u64(st, o + 4);
            size_t n_row = transposed ? view_u32(st, o + 8) : n_cell;
            o += 12;
            push(out, glue, o - glue);
            size_t start = o;
            for (size_t c = 0; c < n_row; c += rows) {
                size_t k = (n_row - c < rows ? n_row - c : rows);
                if (row && k > (size_t)-1 / row) return 0;
                NEED(k * row);
                o += k * row;
                push(out, start, o - start);
                start = o;
            }
            glue = o;
        }
    }
#undef NEED
    if (o != size) return 0;
    if (size > glue) push(out, glue, size - glue);
    return 1;
}

static void cut(const view *st, uint32_t rows, spans *out, int *rows_layout) {
    size_t size = st->size;
    *rows_layout = rows > 0 && cut_rows(st, rows, out);
    if (*rows_layout) return;
    out->n = 0;
    for (size_t o = 0; o < size; o += FIXED_SPAN) push(out, o, size - o < FIXED_SPAN ? size - o : FIXED_SPAN);
}

#ifdef KV_SLOT_XXH3_DISPATCH
__attribute__((__target__("avx512f"), __noinline__)) static XXH64_hash_t xxh3_long_avx512(const void *p, size_t len) {
    return XXH3_hashLong_64b_internal(p, len, XXH3_kSecret, sizeof XXH3_kSecret, XXH3_accumulate_avx512,
                                      XXH3_scrambleAcc_avx512);
}
__attribute__((__target__("avx2"), __noinline__)) static XXH64_hash_t xxh3_long_avx2(const void *p, size_t len) {
    return XXH3_hashLong_64b_internal(p, len, XXH3_kSecret, sizeof XXH3_kSecret, XXH3_accumulate_avx2,
                                      XXH3_scrambleAcc_avx2);
}
#endif

static uint64_t xxh3(const uint8_t *data, size_t len) {
#ifdef KV_SLOT_XXH3_DISPATCH
    if (len > XXH3_MIDSIZE_MAX) {
        if (__builtin_cpu_supports("avx512f")) return xxh3_long_avx512(data, len);
        if (__builtin_cpu_supports("avx2")) return xxh3_long_avx2(data, len);
    }
#endif
    return XXH3_64bits(data, len);
}

static void key_of(const uint8_t *data, size_t len, uint8_t key[KV_SLOT_HASH_LEN]) {
    put_u64(key, xxh3(data, len));
}

/* ---- a save on two threads: the caller calls the backend, a helper hashes ----
 *
 * The hash over the state costs as much as the backend's own copies
 * (docs/llama.md), and the server's compute threads are idle during a save:
 * one helper thread hashes while the caller talks to the backend, which a
 * save only ever calls from the caller's thread. Without a helper
 * (pthread_create failed) the caller does it all, in the same order. */

double kv_slot_now_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e3 + (double)t.tv_nsec / 1e6;
}

int kv_slot_tracing(void) {
    const char *v = getenv("KV_SLOT_TRACE");
    return v && *v;
}

/* A save's hashing: the helper hashes spans from the front; the caller
 * puts them in order and, when the next is not hashed yet, hashes it
 * itself or, while the helper is on it, one from the back. */
typedef struct {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    const view *state;
    const spans *sp;
    const uint8_t **run;   /* per span: its bytes in one place (set when hashed) */
    uint8_t **joined;      /* per span that spans pieces: a copy of it, else NULL */
    uint8_t *manifest;     /* each span's key and length go in its entry */
    unsigned char *hashed; /* per span; under mu */
    size_t lo, hi;         /* spans [lo, hi) are not claimed yet; under mu */
    double helper_ms;      /* the helper's time hashing */
    size_t helper_spans;   /* spans the helper hashed */
} save_hashing;

static void hash_span(save_hashing *h, size_t i) {
    uint8_t *e = h->manifest + MANIFEST_HEAD + i * MANIFEST_ENTRY;
    size_t off = h->sp->s[i].off, len = h->sp->s[i].len;
    const uint8_t *run = view_run(h->state, off, len);
    if (!run) {
        h->joined[i] = (uint8_t *)malloc(len);
        if (!h->joined[i]) abort();
        view_copy(h->state, off, len, h->joined[i]);
        run = h->joined[i];
    }
    h->run[i] = run;
    key_of(run, len, e);
    put_u32(e + KV_SLOT_HASH_LEN, (uint32_t)h->sp->s[i].len);
}

static void *save_helper(void *arg) {
    save_hashing *h = (save_hashing *)arg;
    pthread_mutex_lock(&h->mu);
    while (h->lo < h->hi) {
        size_t i = h->lo++;
        pthread_mutex_unlock(&h->mu);
        double t = kv_slot_now_ms();
        hash_span(h, i);
        h->helper_ms += kv_slot_now_ms() - t;
        h->helper_spans++;
        pthread_mutex_lock(&h->mu);
        h->hashed[i] = 1;
        pthread_cond_signal(&h->cv);
    }
    pthread_mutex_unlock(&h->mu);
    return NULL;
}

/* Returns once span i is hashed. Every span before i is hashed, so i is
 * either the next unclaimed one, or the helper's, or was hashed from the
 * back. */
static void await_hash(save_hashing *h, size_t i) {
    pthread_mutex_lock(&h->mu);
    while (!h->hashed[i]) {
        if (h->lo < h->hi) {
            size_t j = h->lo == i ? h->lo++ : --h->hi;
            pthread_mutex_unlock(&h->mu);
            hash_span(h, j);
            pthread_mutex_lock(&h->mu);
            h->hashed[j] = 1;
        } else {
            pthread_cond_wait(&h->cv, &h->mu);
        }
    }
    pthread_mutex_unlock(&h->mu);
}

static int save_view(const kv_store_vtable *vt, kv_store_v1 *store, const char *name, const view *state,
                     uint32_t rows, kv_slot_save_stats *stats, kv_slot_error *err) {
    memset(stats, 0, sizeof *stats);
    double t0 = kv_slot_now_ms();
    size_t size = state->size;
    spans sp = {NULL, 0, 0};
    cut(state, rows, &sp, &stats->rows_layout);
    size_t mlen = MANIFEST_HEAD + sp.n * MANIFEST_ENTRY;
    uint8_t *m = (uint8_t *)malloc(mlen);
    unsigned char *hashed = (unsigned char *)calloc(sp.n ? sp.n : 1, 1);
    const uint8_t **run = (const uint8_t **)calloc(sp.n ? sp.n : 1, sizeof *run);
    uint8_t **joined = (uint8_t **)calloc(sp.n ? sp.n : 1, sizeof *joined);
    if (!m || !hashed || !run || !joined) abort();
    put_u32(m, MANIFEST_MAGIC);
    put_u32(m + 4, MANIFEST_VERSION);
    put_u32(m + 8, stats->rows_layout ? rows : 0);
    put_u32(m + 12, (uint32_t)sp.n);
    put_u64(m + 16, size);
    save_hashing h = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, state, &sp, run, joined, m, hashed, 0, sp.n,
                      0, 0};
    pthread_t helper;
    int threaded = sp.n > 1 && pthread_create(&helper, NULL, save_helper, &h) == 0;
    double put_ms = 0;
    int result = 0;
    for (size_t i = 0; i < sp.n && result == 0; i++) {
        await_hash(&h, i);
        const uint8_t *e = m + MANIFEST_HEAD + i * MANIFEST_ENTRY;
        double t = kv_slot_now_ms();
        int rc = vt->put_chunk(store, e, KV_SLOT_HASH_LEN, run[i], sp.s[i].len);
        put_ms += kv_slot_now_ms() - t;
        free(joined[i]);
        joined[i] = NULL;
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
    if (threaded) {
        pthread_mutex_lock(&h.mu);
        h.lo = h.hi; /* after a failure: nothing more to hash */
        pthread_mutex_unlock(&h.mu);
        pthread_join(helper, NULL);
    }
    double t_manifest = kv_slot_now_ms();
    if (result == 0) {
        int rc = vt->put_manifest(store, name, m, mlen);
        if (rc < 0)
            result = fail(err, rc, "put_manifest", "put_manifest returned %d: %s", rc, kv_slot_rc_meaning(rc));
    }
    stats->chunks = sp.n;
    if (kv_slot_tracing())
        fprintf(stderr,
                "kv_slot: save %s: %zu chunks (%zu stored) in %.2f ms: put_chunk %.2f, put_manifest %.2f, "
                "helper hashing %.2f (%zu chunks)%s\n",
                name, sp.n, stats->stored, kv_slot_now_ms() - t0, put_ms, kv_slot_now_ms() - t_manifest, h.helper_ms,
                h.helper_spans, threaded ? "" : " (no helper)");
    for (size_t i = 0; i < sp.n; i++) free(joined[i]); /* hashed but not put, after a failure */
    free(joined);
    free(run);
    free(hashed);
    free(m);
    free(sp.s);
    return result;
}

int kv_slot_save(const kv_store_vtable *vt, kv_store_v1 *store, const char *name, const uint8_t *state, size_t size,
                 uint32_t rows, kv_slot_save_stats *stats, kv_slot_error *err) {
    struct kv_slot_piece whole = {0, size, state, 0};
    view v = {&whole, size ? 1 : 0, NULL, size};
    return save_view(vt, store, name, &v, rows, stats, err);
}

int kv_slot_save_pieces(const kv_store_vtable *vt, kv_store_v1 *store, const char *name, const kv_slot_pieces *state,
                        uint32_t rows, kv_slot_save_stats *stats, kv_slot_error *err) {
    view v = {state->piece, state->n, state->copied, state->size};
    return save_view(vt, store, name, &v, rows, stats, err);
}

/* ---- a restore, read in order: kv_slot_reader ----
 *
 * The state is handed out as the caller reads it: llama.cpp's
 * llama_state_seq_set_data_cb reads it in order, a few bytes of metadata
 * at a time, then each layer's K and V rows straight into the tensors. A
 * chunk that lies wholly inside one read is fetched into the caller's
 * memory (get_chunk_into, or get_chunk and a copy) and checked there,
 * length and xxh3-64, while still in cache; the chunks of a read are shared
 * by the caller's thread and a helper (kv_store_v1 handles may be called
 * from several threads), which also sends prefetch_chunks first. A chunk
 * that a read covers only in part (metadata, a region's descriptor, or any
 * chunk of a state cut otherwise) is fetched into a bounce buffer and
 * checked before any of its
 * bytes are handed out, so the caller never parses unchecked bytes. Rows
 * may reach the caller's memory before their chunk's check fails: the read
 * then fails, and the caller undoes what it wrote (the server puts the
 * slot back as it was). */

/* A read with fewer whole chunks than this is not worth waking the helper. */
#define READ_BATCH_MIN 2

struct kv_slot_reader {
    const kv_store_vtable *vt;
    kv_slot_get_chunk_into_fn get_into;
    kv_store_v1 *store;
    char *name;
    uint8_t *manifest;
    uint8_t *keys; /* the chunks' keys, back to back, for prefetch_chunks */
    size_t n;
    size_t *off;   /* n + 1 entries: where each chunk begins, then the state's size */
    size_t pos;    /* bytes handed out */
    size_t chunk;  /* the chunk holding `pos` (n at the end) */
    uint8_t *bounce;
    size_t bounce_cap;
    size_t bounced; /* the chunk in `bounce`, checked, or SIZE_MAX */
    size_t bounces; /* chunks fetched into it */
    kv_slot_error err; /* a failure other than a chunk's (`failed`) */
    int failed;
    double t0, prefetch_ms;
    /* The batch: chunks [next, end) of a read not taken yet, chunk i going to
     * dst + off[i] - base; `busy` taken and not done. All under mu. */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    pthread_t helper;
    int threaded, quit;
    uint8_t *dst;
    size_t base, next, end, busy;
    /* The first chunk in order that failed, or SIZE_MAX; under mu. */
    size_t bad;
    const char *why; /* what of it did not match, or */
    int bad_rc;      /* its get's return */
    double fetch_ms[2]; /* per thread (0: the caller's), each written by its own */
    size_t fetched[2];
};

static const uint8_t *reader_entry(const kv_slot_reader *r, size_t i) {
    return r->manifest + MANIFEST_HEAD + i * MANIFEST_ENTRY;
}

/* Fetches chunk i into `dst` (its length, as the manifest says) and checks
 * it there; 0, or -1 with the failure noted (the first in chunk order is
 * kept). */
static int fetch_chunk(kv_slot_reader *r, size_t i, uint8_t *dst, int who) {
    const uint8_t *e = reader_entry(r, i);
    size_t want = r->off[i + 1] - r->off[i], got = 0;
    const char *why = NULL;
    int rc;
    double t = kv_slot_now_ms();
    if (r->get_into) {
        rc = r->get_into(r->store, e, KV_SLOT_HASH_LEN, dst, want, &got);
        if (rc == KV_SLOT_INTO_TOO_SMALL && got > want) {
            rc = 0; /* longer than its entry */
            why = "length";
        }
    } else {
        uint8_t *data = NULL;
        rc = r->vt->get_chunk(r->store, e, KV_SLOT_HASH_LEN, &data, &got);
        if (rc >= 0 && got == want && want > 0) {
            if (data)
                memcpy(dst, data, want);
            else
                why = "length"; /* a length with no bytes behind it */
        }
        free(data); /* backend outputs come from malloc */
    }
    if (rc >= 0 && !why && got != want) why = "length";
    if (rc >= 0 && !why) {
        uint8_t key[KV_SLOT_HASH_LEN];
        key_of(dst, want, key);
        if (memcmp(key, e, KV_SLOT_HASH_LEN) != 0) why = "xxh3-64";
    }
    r->fetch_ms[who] += kv_slot_now_ms() - t;
    r->fetched[who]++;
    if (rc >= 0 && !why) return 0;
    pthread_mutex_lock(&r->mu);
    if (i < r->bad) {
        r->bad = i;
        r->why = why;
        r->bad_rc = rc < 0 ? rc : 0;
    }
    pthread_mutex_unlock(&r->mu);
    return -1;
}

/* Takes the batch's chunks until none is left (or one failed); mu held on
 * entry and exit. */
static void batch_work(kv_slot_reader *r, int who) {
    while (r->next < r->end && r->bad == SIZE_MAX) {
        size_t i = r->next++;
        r->busy++;
        uint8_t *dst = r->dst + (r->off[i] - r->base);
        pthread_mutex_unlock(&r->mu);
        fetch_chunk(r, i, dst, who);
        pthread_mutex_lock(&r->mu);
        if (--r->busy == 0) pthread_cond_broadcast(&r->cv); /* the caller may be waiting for it */
    }
}

static void prefetch(kv_slot_reader *r) {
    /* A hint: a failure leaves the gets to do the work. */
    if (r->vt->version < 2 || !r->vt->prefetch_chunks || r->n == 0) return;
    double t = kv_slot_now_ms();
    r->vt->prefetch_chunks(r->store, r->keys, KV_SLOT_HASH_LEN, r->n);
    r->prefetch_ms = kv_slot_now_ms() - t;
}

static void *reader_helper(void *arg) {
    kv_slot_reader *r = (kv_slot_reader *)arg;
    prefetch(r);
    pthread_mutex_lock(&r->mu);
    while (!r->quit) {
        batch_work(r, 1);
        if (!r->quit) pthread_cond_wait(&r->cv, &r->mu);
    }
    pthread_mutex_unlock(&r->mu);
    return NULL;
}

int kv_slot_reader_open(const kv_store_vtable *vt, kv_slot_get_chunk_into_fn get_into, kv_store_v1 *store,
                        const char *name, kv_slot_reader **out, kv_slot_error *err) {
    *out = NULL;
    double t0 = kv_slot_now_ms();
    uint8_t *m = NULL;
    size_t mlen = 0;
    int rc = vt->get_manifest(store, name, &m, &mlen);
    if (rc < 0)
        return fail(err, rc, "get_manifest", "get_manifest returned %d: %s", rc, kv_slot_rc_meaning(rc));
    if (!m || mlen < MANIFEST_HEAD || get_u32(m) != MANIFEST_MAGIC || get_u32(m + 4) != MANIFEST_VERSION) {
        free(m);
        return fail(err, 0, "manifest", "not a kv_slot manifest (%zu bytes)", mlen);
    }
    size_t n = get_u32(m + 12);
    uint64_t total = get_u64(m + 16);
    /* (the first test keeps the sizes below from wrapping where size_t is 32 bits) */
    if (n > (SIZE_MAX - MANIFEST_HEAD) / MANIFEST_ENTRY - 1 || mlen != MANIFEST_HEAD + n * MANIFEST_ENTRY ||
        total > SIZE_MAX) {
        free(m);
        return fail(err, 0, "manifest", "the manifest's length (%zu bytes) does not match its %zu chunks", mlen, n);
    }
    /* kv_slot_save writes no empty chunk: one would be a name never checked */
    for (size_t i = 0; i < n; i++) {
        if (get_u32(m + MANIFEST_HEAD + i * MANIFEST_ENTRY + KV_SLOT_HASH_LEN) == 0) {
            free(m);
            return fail(err, 0, "manifest", "chunk %zu of %zu has 0 bytes", i, n);
        }
    }
    kv_slot_reader *r = (kv_slot_reader *)calloc(1, sizeof *r);
    size_t *off = (size_t *)malloc((n + 1) * sizeof *off);
    uint8_t *keys = (uint8_t *)malloc(n ? n * KV_SLOT_HASH_LEN : 1);
    char *copy = strdup(name);
    if (!r || !off || !keys || !copy) abort();
    uint64_t sum = 0;
    for (size_t i = 0; i < n; i++) {
        const uint8_t *e = m + MANIFEST_HEAD + i * MANIFEST_ENTRY;
        memcpy(keys + i * KV_SLOT_HASH_LEN, e, KV_SLOT_HASH_LEN);
        off[i] = (size_t)sum;
        sum += get_u32(e + KV_SLOT_HASH_LEN);
    }
    off[n] = (size_t)sum;
    if (sum != total) {
        free(r);
        free(off);
        free(keys);
        free(copy);
        free(m);
        return fail(err, 0, "manifest", "the manifest's chunks hold %llu bytes, its header says %llu",
                    (unsigned long long)sum, (unsigned long long)total);
    }
    r->vt = vt;
    r->get_into = get_into;
    r->store = store;
    r->name = copy;
    r->manifest = m;
    r->keys = keys;
    r->n = n;
    r->off = off;
    r->bounced = SIZE_MAX;
    r->bad = SIZE_MAX;
    r->t0 = t0;
    pthread_mutex_init(&r->mu, NULL);
    pthread_cond_init(&r->cv, NULL);
    r->threaded = n > 1 && pthread_create(&r->helper, NULL, reader_helper, r) == 0;
    if (!r->threaded) prefetch(r);
    *out = r;
    return 0;
}

size_t kv_slot_reader_size(const kv_slot_reader *r) {
    return r->off[r->n];
}

size_t kv_slot_reader_chunks(const kv_slot_reader *r) {
    return r->n;
}

size_t kv_slot_reader_bounced(const kv_slot_reader *r) {
    return r->bounces;
}

/* Fetches whole chunks [i, j) into `dst`, where chunk i begins; 0 or -1. */
static int fetch_whole(kv_slot_reader *r, size_t i, size_t j, uint8_t *dst) {
    if (!r->threaded || j - i < READ_BATCH_MIN) {
        for (size_t k = i; k < j; k++)
            if (fetch_chunk(r, k, dst + (r->off[k] - r->off[i]), 0) != 0) return -1;
        return 0;
    }
    pthread_mutex_lock(&r->mu);
    r->dst = dst;
    r->base = r->off[i];
    r->next = i;
    r->end = j;
    pthread_cond_broadcast(&r->cv);
    batch_work(r, 0);
    while (r->busy > 0) pthread_cond_wait(&r->cv, &r->mu);
    r->next = r->end; /* after a failure: nothing more to take */
    int ok = r->bad == SIZE_MAX;
    pthread_mutex_unlock(&r->mu);
    return ok ? 0 : -1;
}

int kv_slot_read(kv_slot_reader *r, void *into, size_t len) {
    uint8_t *dst = (uint8_t *)into;
    if (r->failed || r->bad != SIZE_MAX) return -1; /* bad is only set during a read */
    if (len > r->off[r->n] - r->pos) {
        r->failed = 1;
        return fail(&r->err, 0, "read", "a read of %zu bytes at %zu goes past the state's end (%zu bytes)", len, r->pos,
                    r->off[r->n]);
    }
    while (len > 0) {
        while (r->off[r->chunk + 1] <= r->pos) r->chunk++; /* skips empty chunks; pos < size here */
        size_t i = r->chunk, start = r->off[i], end = r->off[i + 1], step;
        if (r->pos == start && end - start <= len) {
            size_t j = i + 1;
            while (j < r->n && r->off[j + 1] - start <= len) j++;
            if (fetch_whole(r, i, j, dst) != 0) return -1;
            step = r->off[j] - start;
        } else {
            if (r->bounced != i && r->bounced != SIZE_MAX && end - start == r->off[r->bounced + 1] - r->off[r->bounced] &&
                memcmp(reader_entry(r, i), reader_entry(r, r->bounced), KV_SLOT_HASH_LEN) == 0) {
                r->bounced = i; /* the chunk checked last, again (each region's descriptor): no fetch */
            }
            if (r->bounced != i) {
                if (end - start > r->bounce_cap) {
                    free(r->bounce);
                    r->bounce_cap = 0;
                    r->bounced = SIZE_MAX;
                    if (!(r->bounce = (uint8_t *)malloc(end - start))) {
                        r->failed = 1;
                        return fail(&r->err, 0, "memory", "no memory for a chunk of %zu bytes", end - start);
                    }
                    r->bounce_cap = end - start;
                }
                r->bounces++;
                r->bounced = SIZE_MAX; /* the buffer holds none checked until the fetch succeeds */
                if (fetch_chunk(r, i, r->bounce, 0) != 0) return -1;
                r->bounced = i;
            }
            step = end - r->pos < len ? end - r->pos : len;
            memcpy(dst, r->bounce + (r->pos - start), step);
        }
        r->pos += step;
        dst += step;
        len -= step;
    }
    return 0;
}

int kv_slot_reader_close(kv_slot_reader *r, kv_slot_error *err) {
    if (!r) return 0;
    if (r->threaded) {
        pthread_mutex_lock(&r->mu);
        r->quit = 1;
        pthread_cond_broadcast(&r->cv);
        pthread_mutex_unlock(&r->mu);
        pthread_join(r->helper, NULL);
    }
    int result = 0;
    size_t size = r->off[r->n];
    if (r->failed) {
        *err = r->err;
        result = -1;
    } else if (r->bad != SIZE_MAX) {
        unsigned long long key = (unsigned long long)get_u64(reader_entry(r, r->bad));
        if (r->bad_rc < 0)
            result = fail(err, r->bad_rc, "get_chunk", "get_chunk of chunk %zu of %zu (%016llx) returned %d: %s",
                          r->bad, r->n, key, r->bad_rc, kv_slot_rc_meaning(r->bad_rc));
        else
            result = fail(err, 0, "get_chunk", "chunk %zu of %zu (%016llx) does not match its manifest entry (%s)",
                          r->bad, r->n, key, r->why);
    } else if (r->pos != size) {
        result = fail(err, 0, "read", "%zu of the state's %zu bytes were read", r->pos, size);
    }
    if (kv_slot_tracing() && result == 0)
        fprintf(stderr,
                "kv_slot: load %s: %zu chunks in %.2f ms: prefetch_chunks %.2f%s, %s and checks %.2f (%zu chunks), "
                "helper %.2f (%zu chunks), %zu through the bounce buffer\n",
                r->name, r->n, kv_slot_now_ms() - r->t0, r->prefetch_ms, r->threaded ? " (helper)" : "",
                r->get_into ? "get_chunk_into" : "get_chunk", r->fetch_ms[0], r->fetched[0], r->fetch_ms[1],
                r->fetched[1], r->bounces);
    pthread_mutex_destroy(&r->mu);
    pthread_cond_destroy(&r->cv);
    free(r->bounce);
    free(r->off);
    free(r->keys);
    free(r->manifest);
    free(r->name);
    free(r);
    return result;
}

int kv_slot_load(const kv_store_vtable *vt, kv_store_v1 *store, const char *name, kv_slot_buf *state, size_t *size,
                 size_t *chunks, kv_slot_error *err) {
    return kv_slot_load_into(vt, NULL, store, name, state, size, chunks, err);
}

int kv_slot_load_into(const kv_store_vtable *vt, kv_slot_get_chunk_into_fn get_into, kv_store_v1 *store,
                      const char *name, kv_slot_buf *state, size_t *size, size_t *chunks, kv_slot_error *err) {
    kv_slot_reader *r;
    if (kv_slot_reader_open(vt, get_into, store, name, &r, err) != 0) return -1;
    size_t total = kv_slot_reader_size(r), n = kv_slot_reader_chunks(r);
    uint8_t *st = kv_slot_buf_reserve(state, total ? total : 1);
    if (!st) {
        kv_slot_reader_close(r, err);
        return fail(err, 0, "memory", "no memory for a state of %zu bytes", total);
    }
    kv_slot_read(r, st, total); /* a failure is the close's answer */
    if (kv_slot_reader_close(r, err) != 0) return -1;
    *size = total;
    *chunks = n;
    return 0;
}
