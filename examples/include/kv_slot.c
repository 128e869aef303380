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

/* ---- two threads: the caller calls the backend, a helper hashes ----
 *
 * The passes over the state (xxh3, and a restore's copy into the buffer)
 * cost as much as the backend's own copies (docs/llama.md), and the
 * server's compute threads are idle during a save or restore: one helper
 * thread takes them while the caller talks to the backend, which is only
 * ever called from the caller's thread. Without a helper (pthread_create
 * failed) the caller does it all, in the same order. */

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

/* A restore's checking: the caller fetches the chunks in order; the
 * helper and the caller check fetched chunks (length, xxh3-64) and copy
 * them into place, oldest first. The caller checks one itself rather than
 * fetch more than LOAD_AHEAD ahead, so a helper that gets no core (a busy
 * machine) costs little: the caller then does what it did alone, on
 * chunks still in its cache. */
#define LOAD_AHEAD 4

typedef struct {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    const uint8_t *manifest;
    uint8_t *state;
    uint8_t **data;  /* per chunk: the backend's block, until checked */
    size_t *len;     /* per chunk: its length */
    size_t *off;     /* per chunk: where it goes in the state */
    size_t fetched;  /* chunks [0, fetched) are fetched; under mu */
    size_t claimed;  /* chunks [0, claimed) are checked or being checked; under mu */
    int no_more;     /* the caller fetches nothing more; under mu */
    size_t bad;      /* the first chunk that failed its check, or SIZE_MAX; under mu */
    const char *why; /* what of it did not match; under mu */
    double helper_ms;
    size_t helper_chunks; /* chunks the helper checked */
} load_checking;

/* Claims the oldest fetched chunk not claimed yet (SIZE_MAX if none, or
 * after a failed check); mu held. */
static size_t claim_chunk(load_checking *c) {
    return c->claimed < c->fetched && c->bad == SIZE_MAX ? c->claimed++ : SIZE_MAX;
}

/* Checks claimed chunk i and copies it into place; frees its block. mu is
 * held on entry and exit, released meanwhile. */
static void check_chunk(load_checking *c, size_t i) {
    pthread_mutex_unlock(&c->mu);
    const uint8_t *e = c->manifest + MANIFEST_HEAD + i * MANIFEST_ENTRY;
    uint8_t key[KV_SLOT_HASH_LEN];
    const char *why = NULL;
    if (c->len[i] != get_u32(e + KV_SLOT_HASH_LEN)) {
        why = "length";
    } else {
        key_of(c->data[i], c->len[i], key);
        if (memcmp(key, e, KV_SLOT_HASH_LEN) != 0)
            why = "xxh3-64";
        else
            memcpy(c->state + c->off[i], c->data[i], c->len[i]); /* still in cache from the hash */
    }
    free(c->data[i]); /* backend outputs come from malloc */
    c->data[i] = NULL;
    pthread_mutex_lock(&c->mu);
    if (why && i < c->bad) {
        c->bad = i;
        c->why = why;
    }
}

static void *load_helper(void *arg) {
    load_checking *c = (load_checking *)arg;
    pthread_mutex_lock(&c->mu);
    for (;;) {
        size_t i = claim_chunk(c);
        if (i == SIZE_MAX) {
            if (c->no_more) break;
            pthread_cond_wait(&c->cv, &c->mu);
            continue;
        }
        double t = kv_slot_now_ms();
        check_chunk(c, i);
        c->helper_ms += kv_slot_now_ms() - t;
        c->helper_chunks++;
    }
    pthread_mutex_unlock(&c->mu);
    return NULL;
}

/* A restore with get_chunk_into: the caller and the helper each take the
 * next chunk, have the backend write it into its place in the state and
 * check it there (length, xxh3-64), still in their own cache: the reads,
 * the backend's calls and the hashing on both cores, no block per chunk.
 * (kv_store_v1 handles may be called from several threads.) Chunks are
 * taken in order and none after a failure, so the first failure in chunk
 * order is among those recorded. */
typedef struct {
    pthread_mutex_t mu;
    kv_slot_get_chunk_into_fn get_into;
    kv_store_v1 *store;
    const uint8_t *manifest;
    uint8_t *state;
    const size_t *off;
    size_t n;
    size_t next;     /* the next chunk to take; under mu */
    size_t bad;      /* the first chunk that failed, or SIZE_MAX; under mu */
    const char *why; /* what of it did not match; under mu */
    int rc;          /* its get's return, if that failed; under mu */
    double get_ms[2]; /* per thread (0: the caller) */
    size_t done[2];
} into_loading;

static void into_work(into_loading *l, int who) {
    for (;;) {
        pthread_mutex_lock(&l->mu);
        size_t i = l->bad == SIZE_MAX && l->next < l->n ? l->next++ : SIZE_MAX;
        pthread_mutex_unlock(&l->mu);
        if (i == SIZE_MAX) return;
        const uint8_t *e = l->manifest + MANIFEST_HEAD + i * MANIFEST_ENTRY;
        size_t want = get_u32(e + KV_SLOT_HASH_LEN), got = 0;
        double t = kv_slot_now_ms();
        int rc = l->get_into(l->store, e, KV_SLOT_HASH_LEN, l->state + l->off[i], want, &got);
        const char *why = NULL;
        if (rc == KV_SLOT_INTO_TOO_SMALL && got > want) {
            rc = 0; /* longer than its entry */
            why = "length";
        } else if (rc >= 0 && got != want) {
            why = "length";
        } else if (rc >= 0) {
            uint8_t key[KV_SLOT_HASH_LEN];
            key_of(l->state + l->off[i], want, key);
            if (memcmp(key, e, KV_SLOT_HASH_LEN) != 0) why = "xxh3-64";
        }
        l->get_ms[who] += kv_slot_now_ms() - t;
        l->done[who]++;
        if (rc < 0 || why) {
            pthread_mutex_lock(&l->mu);
            if (i < l->bad) {
                l->bad = i;
                l->why = why;
                l->rc = rc < 0 ? rc : 0;
            }
            pthread_mutex_unlock(&l->mu);
        }
    }
}

static void *into_helper(void *arg) {
    into_work((into_loading *)arg, 1);
    return NULL;
}

int kv_slot_load(const kv_store_vtable *vt, kv_store_v1 *store, const char *name, kv_slot_buf *state, size_t *size,
                 size_t *chunks, kv_slot_error *err) {
    return kv_slot_load_into(vt, NULL, store, name, state, size, chunks, err);
}

int kv_slot_load_into(const kv_store_vtable *vt, kv_slot_get_chunk_into_fn get_into, kv_store_v1 *store,
                      const char *name, kv_slot_buf *state, size_t *size, size_t *chunks, kv_slot_error *err) {
    double t0 = kv_slot_now_ms();
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
    uint8_t **data = (uint8_t **)calloc(n ? n : 1, sizeof *data);
    size_t *len = (size_t *)calloc(n ? n : 1, sizeof *len), *off = (size_t *)malloc((n ? n : 1) * sizeof *off);
    if (!keys || !data || !len || !off) abort();
    uint64_t sum = 0;
    for (size_t i = 0; i < n; i++) {
        memcpy(keys + i * KV_SLOT_HASH_LEN, m + MANIFEST_HEAD + i * MANIFEST_ENTRY, KV_SLOT_HASH_LEN);
        off[i] = (size_t)sum;
        sum += get_u32(m + MANIFEST_HEAD + i * MANIFEST_ENTRY + KV_SLOT_HASH_LEN);
    }
    int result = 0;
    uint8_t *st = NULL;
    if (sum != total) {
        result = fail(err, 0, "manifest", "the manifest's chunks hold %llu bytes, its header says %llu",
                      (unsigned long long)sum, (unsigned long long)total);
    } else if (!(st = kv_slot_buf_reserve(state, total ? (size_t)total : 1))) {
        result = fail(err, 0, "memory", "no memory for a state of %llu bytes", (unsigned long long)total);
    }
    double t_prefetch = kv_slot_now_ms(), prefetch_ms = 0, get_ms = 0;
    /* A hint: a failure leaves the per-chunk gets to do the work. */
    if (result == 0 && vt->version >= 2 && vt->prefetch_chunks && n) {
        vt->prefetch_chunks(store, keys, KV_SLOT_HASH_LEN, n);
        prefetch_ms = kv_slot_now_ms() - t_prefetch;
    }
    free(keys);
    double join_ms = 0, helper_ms = 0;
    size_t helper_chunks = 0, bad = SIZE_MAX; /* the first chunk that failed */
    const char *why = NULL;                   /* what of it did not match, or */
    int threaded = 0, bad_rc = 0;             /* its get's return */
    if (get_into) {
        into_loading l = {PTHREAD_MUTEX_INITIALIZER, get_into, store, m, st, off, n, 0, SIZE_MAX, NULL, 0,
                          {0, 0}, {0, 0}};
        if (result == 0) {
            pthread_t helper;
            threaded = n > 1 && pthread_create(&helper, NULL, into_helper, &l) == 0;
            into_work(&l, 0);
            double t_join = kv_slot_now_ms();
            if (threaded) pthread_join(helper, NULL);
            join_ms = kv_slot_now_ms() - t_join;
        }
        get_ms = l.get_ms[0];
        helper_ms = l.get_ms[1];
        helper_chunks = l.done[1];
        bad = l.bad;
        why = l.why;
        bad_rc = l.rc;
    } else {
        load_checking c = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, m, st, data, len, off, 0, 0, 0,
                           SIZE_MAX, NULL, 0, 0};
        pthread_t helper;
        threaded = result == 0 && n > 1 && pthread_create(&helper, NULL, load_helper, &c) == 0;
        size_t failed_get = n; /* the chunk whose get_chunk failed */
        pthread_mutex_lock(&c.mu);
        for (size_t i = 0; i < n && result == 0 && c.bad == SIZE_MAX; i++) {
            size_t j;
            while (c.fetched - c.claimed >= LOAD_AHEAD && (j = claim_chunk(&c)) != SIZE_MAX) check_chunk(&c, j);
            if (c.bad != SIZE_MAX) break;
            pthread_mutex_unlock(&c.mu);
            double t = kv_slot_now_ms();
            rc = vt->get_chunk(store, m + MANIFEST_HEAD + i * MANIFEST_ENTRY, KV_SLOT_HASH_LEN, &data[i], &len[i]);
            get_ms += kv_slot_now_ms() - t;
            pthread_mutex_lock(&c.mu);
            if (rc < 0) {
                failed_get = i;
                break;
            }
            c.fetched = i + 1;
            pthread_cond_signal(&c.cv);
        }
        /* The rest, with the helper; then wait for the helper's last chunk. */
        c.no_more = 1;
        pthread_cond_signal(&c.cv);
        for (size_t j; (j = claim_chunk(&c)) != SIZE_MAX;) check_chunk(&c, j);
        pthread_mutex_unlock(&c.mu);
        double t_join = kv_slot_now_ms();
        if (threaded) pthread_join(helper, NULL);
        join_ms = kv_slot_now_ms() - t_join;
        helper_ms = c.helper_ms;
        helper_chunks = c.helper_chunks;
        /* The first failure in chunk order: a chunk that did not match comes
         * before the one whose get failed, as it was fetched first. */
        bad = c.bad != SIZE_MAX ? c.bad : failed_get < n ? failed_get : SIZE_MAX;
        why = c.why;
        bad_rc = c.bad != SIZE_MAX ? 0 : rc;
        for (size_t i = 0; i < c.fetched; i++) free(data[i]); /* left unclaimed after a bad chunk */
    }
    unsigned long long key = bad < n ? (unsigned long long)get_u64(m + MANIFEST_HEAD + bad * MANIFEST_ENTRY) : 0;
    if (result == 0 && bad < n && bad_rc < 0)
        result = fail(err, bad_rc, "get_chunk", "get_chunk of chunk %zu of %zu (%016llx) returned %d: %s", bad, n, key,
                      bad_rc, kv_slot_rc_meaning(bad_rc));
    else if (result == 0 && bad < n)
        result = fail(err, 0, "get_chunk", "chunk %zu of %zu (%016llx) does not match its manifest entry (%s)", bad, n,
                      key, why);
    if (kv_slot_tracing() && result == 0)
        fprintf(stderr,
                "kv_slot: load %s: %zu chunks in %.2f ms: prefetch_chunks %.2f, %s %.2f, "
                "helper %s %.2f (%zu chunks), last wait %.2f%s\n",
                name, n, kv_slot_now_ms() - t0, prefetch_ms, get_into ? "get_chunk_into and checks" : "get_chunk",
                get_ms, get_into ? "get_chunk_into and checks" : "checking", helper_ms, helper_chunks, join_ms,
                threaded ? "" : " (no helper)");
    free(data);
    free(len);
    free(off);
    free(m);
    if (result != 0) return result;
    *size = (size_t)total;
    *chunks = n;
    return 0;
}
