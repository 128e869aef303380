/* kv_slot_test: a state saved in pieces (as the patched llama-server hands
 * it out through llama_state_seq_get_data_cb) gives the same manifest and
 * the same chunks, byte for byte, as the contiguous state (as
 * examples/llama-slot saves it), so stores written by either restore
 * through the other, and as the code before wrote them. Synthetic states
 * in llama.cpp's sequence layout (one range of cells, plain and transposed
 * V, empty streams after it), and one whose layout is not recognised; an
 * in-memory store.
 *
 * cc -O2 -I. -I<xxhash dir> kv_slot_test.c kv_slot.c -pthread
 * (scripts/llama-e2e.sh --server builds and runs it). Prints one line per
 * check, then "kv_slot_test: OK"; exits 1 on the first failure. */
#include "kv_slot.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SEQ_IO_MAGIC 0xaf143cd8u

#define CHECK(cond, ...)                              \
    do {                                              \
        if (!(cond)) {                                \
            fprintf(stderr, "kv_slot_test: FAILED: "); \
            fprintf(stderr, __VA_ARGS__);             \
            fprintf(stderr, "\n");                    \
            exit(1);                                  \
        }                                             \
    } while (0)

/* ---- an in-memory kv_store_v1 ---- */

typedef struct {
    uint8_t key[KV_SLOT_HASH_LEN];
    uint8_t *data;
    size_t len;
} entry;

struct kv_store_v1 {
    entry *chunk;
    size_t n_chunk;
    uint8_t *manifest;
    size_t manifest_len;
};

static entry *find(kv_store_v1 *s, const uint8_t *key) {
    for (size_t i = 0; i < s->n_chunk; i++)
        if (memcmp(s->chunk[i].key, key, KV_SLOT_HASH_LEN) == 0) return &s->chunk[i];
    return NULL;
}

static uint8_t *dup(const uint8_t *p, size_t n) {
    uint8_t *d = (uint8_t *)malloc(n ? n : 1);
    if (!d) abort();
    if (n) memcpy(d, p, n);
    return d;
}

static int put_chunk(kv_store_v1 *s, const uint8_t *key, size_t key_len, const uint8_t *data, size_t len) {
    if (key_len != KV_SLOT_HASH_LEN) return -3;
    if (find(s, key)) return 1;
    entry *grown = (entry *)realloc(s->chunk, (s->n_chunk + 1) * sizeof *grown);
    if (!grown) abort();
    s->chunk = grown;
    memcpy(s->chunk[s->n_chunk].key, key, KV_SLOT_HASH_LEN);
    s->chunk[s->n_chunk].data = dup(data, len);
    s->chunk[s->n_chunk++].len = len;
    return 0;
}

static int get_chunk(kv_store_v1 *s, const uint8_t *key, size_t key_len, uint8_t **out, size_t *len) {
    entry *e = key_len == KV_SLOT_HASH_LEN ? find(s, key) : NULL;
    if (!e) return -2;
    *out = dup(e->data, e->len);
    *len = e->len;
    return 0;
}

/* kv_store_wasm_get_chunk_into's contract (kv_slot.h) */
static int get_chunk_into(kv_store_v1 *s, const uint8_t *key, size_t key_len, uint8_t *buf, size_t cap,
                          size_t *len) {
    entry *e = key_len == KV_SLOT_HASH_LEN ? find(s, key) : NULL;
    *len = 0;
    if (!e) return -2;
    *len = e->len;
    if (e->len > cap) return KV_SLOT_INTO_TOO_SMALL;
    if (e->len) memcpy(buf, e->data, e->len);
    return 0;
}

static int put_manifest(kv_store_v1 *s, const char *name, const uint8_t *data, size_t len) {
    (void)name;
    free(s->manifest);
    s->manifest = dup(data, len);
    s->manifest_len = len;
    return 0;
}

static int get_manifest(kv_store_v1 *s, const char *name, uint8_t **out, size_t *len) {
    (void)name;
    if (!s->manifest) return -2;
    *out = dup(s->manifest, s->manifest_len);
    *len = s->manifest_len;
    return 0;
}

static const kv_store_vtable VT = {1, NULL, NULL, put_chunk, get_chunk, put_manifest, get_manifest, NULL, NULL};

static void store_free(kv_store_v1 *s) {
    for (size_t i = 0; i < s->n_chunk; i++) free(s->chunk[i].data);
    free(s->chunk);
    free(s->manifest);
    memset(s, 0, sizeof *s);
}

/* ---- a state in llama.cpp's layout, and its pieces ---- */

static uint64_t rng = 0x9e3779b97f4a7c15u;
static uint32_t next_rand(void) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (uint32_t)(rng >> 16);
}

typedef struct {
    uint8_t *bytes;
    size_t size, cap;
    kv_slot_pieces pieces;
    size_t *reads; /* the state as llama.cpp reads it back: one read per write */
    size_t n_reads, reads_cap;
} built;

/* Appends to the contiguous state and the same bytes as a piece: `stable`
 * pieces point into `src` (tensor memory), split at random places as
 * several tensor ranges would be; the others are copied. */
static void emit(built *b, const void *src, size_t len, int stable) {
    if (b->size + len > b->cap) {
        b->cap = 2 * (b->size + len);
        b->bytes = (uint8_t *)realloc(b->bytes, b->cap);
        if (!b->bytes) abort();
    }
    memcpy(b->bytes + b->size, src, len);
    b->size += len;
    if (b->n_reads == b->reads_cap) {
        b->reads_cap = b->reads_cap ? 2 * b->reads_cap : 256;
        b->reads = (size_t *)realloc(b->reads, b->reads_cap * sizeof *b->reads);
        if (!b->reads) abort();
    }
    b->reads[b->n_reads++] = len;
    const uint8_t *p = (const uint8_t *)src;
    while (len) {
        size_t k = stable && len > 1 && next_rand() % 2 == 0 ? 1 + next_rand() % (len - 1) : len;
        CHECK(kv_slot_pieces_add(&b->pieces, p, k, stable) == 0, "kv_slot_pieces_add");
        p += k;
        len -= k;
    }
}

static void emit_u32(built *b, uint32_t v) {
    uint8_t le[4] = {(uint8_t)v, (uint8_t)(v >> 8), (uint8_t)(v >> 16), (uint8_t)(v >> 24)};
    emit(b, le, 4, 0);
}

static void emit_u64(built *b, uint64_t v) {
    emit_u32(b, (uint32_t)v);
    emit_u32(b, (uint32_t)(v >> 32));
}

/* A sequence state: the ggsq header with `n_cell` tokens, the io header,
 * one stream of `n_cell` cells, `n_layer` layers of K then V rows
 * (`row` bytes a cell; V transposed if `v_trans`, element size 2), then
 * `empty_streams` streams without cells. `tensor` holds the rows. */
static void build_state(built *b, uint32_t n_cell, uint32_t n_layer, uint32_t row, int v_trans,
                        uint32_t empty_streams, uint8_t *tensor) {
    memset(b, 0, sizeof *b);
    int32_t *tokens = (int32_t *)malloc((n_cell ? n_cell : 1) * sizeof *tokens);
    for (uint32_t i = 0; i < n_cell; i++) tokens[i] = (int32_t)(next_rand() % 32000);
    uint8_t *head = (uint8_t *)malloc(KV_SLOT_GGSQ_HEAD + 4 * (size_t)n_cell);
    kv_slot_write_head(head, 0x67677371u, 2, tokens, n_cell);
    emit(b, head, KV_SLOT_GGSQ_HEAD + 4 * (size_t)n_cell, 0);
    emit_u32(b, SEQ_IO_MAGIC);
    emit_u32(b, 0);                     /* seq id */
    emit_u32(b, 1 + empty_streams);     /* streams */
    emit_u32(b, n_cell);
    for (uint32_t c = 0; c < n_cell; c++) {
        emit_u32(b, c); /* pos */
        emit_u32(b, 1); /* one seq id */
        emit_u32(b, 0);
    }
    if (n_cell == 0) {
        n_layer = 0; /* an empty stream is its cell count alone */
    } else {
        emit_u32(b, (uint32_t)v_trans);
        emit_u32(b, n_layer);
        emit_u32(b, 0); /* n_rot_k, n_rot_v */
        emit_u32(b, 0);
    }
    size_t region = (size_t)n_cell * row;
    for (uint32_t r = 0; r < 2 * n_layer; r++) {
        uint8_t *rows = tensor + r * region;
        emit_u32(b, 1); /* f16 */
        if (v_trans && r >= n_layer) {
            emit_u32(b, 2);       /* element size */
            emit_u32(b, row / 2); /* elements a cell */
            for (uint32_t j = 0; j < row / 2; j++) emit(b, rows + (size_t)j * 2 * n_cell, 2 * (size_t)n_cell, 1);
        } else {
            emit_u64(b, row);
            emit(b, rows, region, 1);
        }
    }
    for (uint32_t s = 0; s < empty_streams; s++) emit_u32(b, 0);
    free(head);
    free(tokens);
}

static void built_free(built *b) {
    free(b->bytes);
    free(b->reads);
    kv_slot_pieces_free(&b->pieces);
}

/* Saves `b` both ways into two stores and compares what they hold; then
 * loads it both ways. */
static uint64_t fnv1a(const uint8_t *p, size_t n) {
    uint64_t h = 0xcbf29ce484222325u;
    for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 0x100000001b3u;
    return h;
}

/* Reads the state of manifest "m" in reads of varied sizes (small ones
 * inside a chunk, large ones across several), into place and through
 * get_chunk; with `corrupt`, one chunk no longer matches: a read fails, the
 * reads after it too, and the close names the chunk. Returns the reads. */
static size_t read_in_pieces(kv_store_v1 *store, const built *b, int corrupt) {
    static const size_t sizes[] = {4, 12, 100, 3, 70000, 1u << 20, 8, 300000};
    size_t reads = 0;
    for (int into = 0; into < 2; into++) {
        kv_slot_reader *r;
        kv_slot_error err;
        CHECK(kv_slot_reader_open(&VT, into ? get_chunk_into : NULL, store, "m", &r, &err) == 0, "open: %s", err.msg);
        CHECK(kv_slot_reader_size(r) == b->size, "the reader's size %zu, the state's %zu", kv_slot_reader_size(r),
              b->size);
        uint8_t *got = (uint8_t *)malloc(b->size ? b->size : 1);
        if (!got) abort();
        size_t at = 0, k = 0;
        int failed = 0;
        while (at < b->size) {
            size_t len = sizes[k++ % (sizeof sizes / sizeof *sizes)];
            if (len > b->size - at) len = b->size - at;
            if (kv_slot_read(r, got + at, len) != 0) {
                failed = 1;
                CHECK(corrupt, "a read of %zu bytes at %zu failed", len, at);
                CHECK(kv_slot_read(r, got, 1) == -1, "a read after a failed one succeeded");
                break;
            }
            at += len;
            reads++;
        }
        if (!corrupt) {
            CHECK(kv_slot_read(r, got, 1) == -1, "a read past the state's end succeeded");
            CHECK(memcmp(got, b->bytes, b->size) == 0, "the bytes read in pieces differ");
            CHECK(kv_slot_reader_close(r, &err) == -1 && strstr(err.msg, "past the state's end"),
                  "a read past the end was not reported: %s", err.msg);
        } else {
            CHECK(failed, "every read of a corrupted state succeeded");
            CHECK(kv_slot_reader_close(r, &err) == -1 && strstr(err.msg, "does not match"),
                  "a corrupted chunk read in pieces was not reported: %s", err.msg);
        }
        free(got);
    }
    return reads;
}

/* Reads the state of manifest "m" into place as llama.cpp reads it back
 * (one read per write: metadata a field at a time, each region's rows at
 * once); returns the chunks that went through the bounce buffer. */
static size_t bounced_reading_as_llama(kv_store_v1 *store, const built *b) {
    kv_slot_reader *r;
    kv_slot_error err;
    CHECK(kv_slot_reader_open(&VT, get_chunk_into, store, "m", &r, &err) == 0, "open: %s", err.msg);
    uint8_t *got = (uint8_t *)malloc(b->size ? b->size : 1);
    if (!got) abort();
    for (size_t i = 0, at = 0; i < b->n_reads; at += b->reads[i++])
        CHECK(kv_slot_read(r, got + at, b->reads[i]) == 0, "read %zu failed", i);
    size_t bounced = kv_slot_reader_bounced(r);
    CHECK(kv_slot_reader_close(r, &err) == 0, "close: %s", err.msg);
    CHECK(memcmp(got, b->bytes, b->size) == 0, "the state read as saved differs");
    free(got);
    return bounced;
}

/* `row_chunks`: the chunks of KV rows, each of which a restore reading as
 * llama.cpp does fetches straight into place (0: not checked; a
 * transposed V is read an element row at a time, across chunks). */
static void check_same(const char *what, built *b, uint32_t rows, int expect_rows_layout, size_t row_chunks,
                       uint64_t manifest) {
    kv_store_v1 whole = {0}, pieces = {0};
    kv_slot_save_stats sw, sp;
    kv_slot_error err;
    CHECK(kv_slot_save(&VT, &whole, "m", b->bytes, b->size, rows, &sw, &err) == 0, "%s: save: %s", what, err.msg);
    CHECK(kv_slot_save_pieces(&VT, &pieces, "m", &b->pieces, rows, &sp, &err) == 0, "%s: save_pieces: %s", what,
          err.msg);
    CHECK(b->pieces.size == b->size, "%s: the pieces hold %zu bytes, the state %zu", what, b->pieces.size, b->size);
    CHECK(sw.rows_layout == expect_rows_layout, "%s: rows_layout %d", what, sw.rows_layout);
    CHECK(whole.manifest_len == pieces.manifest_len && memcmp(whole.manifest, pieces.manifest, whole.manifest_len) == 0,
          "%s: the manifests differ", what);
    CHECK(fnv1a(whole.manifest, whole.manifest_len) == manifest,
          "%s: the manifest (FNV-1a %016llx) is not the one stored before", what,
          (unsigned long long)fnv1a(whole.manifest, whole.manifest_len));
    CHECK(sw.chunks == sp.chunks && sw.stored == sp.stored && sw.deduplicated == sp.deduplicated &&
              sw.bytes_stored == sp.bytes_stored && sw.rows_layout == sp.rows_layout,
          "%s: the save counts differ", what);
    CHECK(whole.n_chunk == pieces.n_chunk, "%s: %zu chunks against %zu", what, whole.n_chunk, pieces.n_chunk);
    for (size_t i = 0; i < whole.n_chunk; i++) {
        entry *e = find(&pieces, whole.chunk[i].key);
        CHECK(e && e->len == whole.chunk[i].len && memcmp(e->data, whole.chunk[i].data, e->len) == 0,
              "%s: chunk %zu differs", what, i);
    }
    /* each store reads back the state */
    kv_slot_buf buf = {NULL, 0};
    size_t size = 0, n = 0;
    CHECK(kv_slot_load(&VT, &pieces, "m", &buf, &size, &n, &err) == 0, "%s: load: %s", what, err.msg);
    CHECK(size == b->size && memcmp(buf.data, b->bytes, size) == 0, "%s: the bytes loaded differ", what);
    CHECK(kv_slot_load(&VT, &whole, "m", &buf, &size, &n, &err) == 0 && n == sw.chunks, "%s: load: %s", what,
          err.msg);
    CHECK(size == b->size && memcmp(buf.data, b->bytes, size) == 0, "%s: the bytes loaded differ", what);
    /* the same, each chunk read straight into its place */
    memset(buf.data, 0xa5, buf.cap);
    CHECK(kv_slot_load_into(&VT, get_chunk_into, &whole, "m", &buf, &size, &n, &err) == 0 && n == sw.chunks,
          "%s: load into place: %s", what, err.msg);
    CHECK(size == b->size && memcmp(buf.data, b->bytes, size) == 0, "%s: the bytes loaded into place differ", what);
    /* read in pieces, as llama_state_seq_set_data_cb reads it: a few bytes
     * of metadata, then runs of rows across several chunks */
    size_t reads = read_in_pieces(&whole, b, 0);
    if (row_chunks) {
        size_t bounced = bounced_reading_as_llama(&whole, b);
        /* at most the metadata, the descriptor (every region's is the same
         * chunk, fetched once) and the empty streams' cell counts */
        CHECK(bounced <= 3 && bounced <= sw.chunks - row_chunks, "%s: %zu of %zu chunks bounced, %zu of them KV rows",
              what, bounced, sw.chunks, row_chunks);
    }
    /* a chunk that no longer matches its manifest entry fails the load */
    if (whole.n_chunk) {
        entry *c = &whole.chunk[whole.n_chunk / 2];
        c->data[0] ^= 1;
        read_in_pieces(&whole, b, 1);
        CHECK(kv_slot_load(&VT, &whole, "m", &buf, &size, &n, &err) == -1 && strstr(err.msg, "does not match"),
              "%s: a flipped byte was not found", what);
        CHECK(kv_slot_load_into(&VT, get_chunk_into, &whole, "m", &buf, &size, &n, &err) == -1 &&
                  strstr(err.msg, "does not match") && strstr(err.msg, "xxh3-64"),
              "%s: a flipped byte read into place was not found", what);
        c->data[0] ^= 1;
        /* longer and shorter than its manifest entry */
        for (int d = -1; d <= 1 && c->len; d += 2) {
            c->len += d;
            CHECK(kv_slot_load_into(&VT, get_chunk_into, &whole, "m", &buf, &size, &n, &err) == -1 &&
                      err.store_rc == 0 && strstr(err.msg, "does not match") && strstr(err.msg, "(length)"),
                  "%s: a chunk %s than its entry was not found: %s", what, d > 0 ? "longer" : "shorter", err.msg);
            c->len -= d;
        }
        free(whole.chunk[0].data);
        whole.chunk[0] = whole.chunk[--whole.n_chunk]; /* gone: get_chunk answers -2 */
        CHECK(kv_slot_load(&VT, &whole, "m", &buf, &size, &n, &err) == -1 && err.store_rc == -2,
              "%s: a missing chunk was not found", what);
        CHECK(kv_slot_load_into(&VT, get_chunk_into, &whole, "m", &buf, &size, &n, &err) == -1 &&
                  err.store_rc == -2 && strstr(err.msg, "returned -2"),
              "%s: a missing chunk read into place was not found", what);
    }
    /* an empty chunk named in a manifest is refused: kv_slot_save writes none,
     * and a reader would never fetch or check it */
    if (whole.manifest_len >= 36) {
        uint8_t len[4];
        memcpy(len, whole.manifest + 32, 4);
        memset(whole.manifest + 32, 0, 4);
        CHECK(kv_slot_load(&VT, &whole, "m", &buf, &size, &n, &err) == -1 && strstr(err.msg, "chunk 0 of") &&
                  strstr(err.msg, "has 0 bytes"),
              "%s: an empty chunk in the manifest was not refused: %s", what, err.msg);
        memcpy(whole.manifest + 32, len, 4);
    }
    kv_slot_buf_release(&buf);
    printf("ok  %s: %zu chunks, the same manifest and chunks from %zu pieces as from one buffer, as stored before; "
           "loaded through get_chunk and into place, and in %zu reads\n",
           what, sw.chunks, b->pieces.n, reads);
    store_free(&whole);
    store_free(&pieces);
}

int main(void) {
    /* `manifest`: the FNV-1a 64 of the manifest this cut writes for the
     * state, so a change to the cut is a decision, not an accident (the cut
     * last changed when region descriptors became spans of their own) */
    const struct {
        const char *what;
        uint32_t n_cell, n_layer, row, empty, rows;
        int v_trans;
        uint64_t manifest;
    } cases[] = {
        {"KV rows, 3001 cells (the bench's cut)", 3001, 4, 1024, 0, 256, 0, 0xc77cb975c1fdc500u},
        {"KV rows, a last stream's 600 cells and 3 empty streams after", 600, 2, 512, 3, 32, 0, 0x08af4d2c9df76c20u},
        {"transposed V, 300 cells", 300, 2, 256, 1, 32, 1, 0x4af6132c0c000ce2u},
        {"cells fewer than a chunk's rows", 17, 3, 128, 1, 256, 0, 0x164ce463f2c1d127u},
        {"no cells", 0, 2, 128, 2, 256, 0, 0x903f408f8d2faeb6u},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        rng = 0x9e3779b97f4a7c15u + i; /* each case its own state, whatever the checks draw */
        size_t tensor_len = 2 * (size_t)cases[i].n_layer * cases[i].n_cell * cases[i].row;
        uint8_t *tensor = (uint8_t *)malloc(tensor_len ? tensor_len : 1);
        for (size_t k = 0; k < tensor_len; k++) tensor[k] = (uint8_t)next_rand();
        built b;
        build_state(&b, cases[i].n_cell, cases[i].n_layer, cases[i].row, cases[i].v_trans, cases[i].empty, tensor);
        size_t row_chunks = cases[i].v_trans ? 0
                                             : 2 * (size_t)cases[i].n_layer *
                                                   ((cases[i].n_cell + cases[i].rows - 1) / cases[i].rows);
        check_same(cases[i].what, &b, cases[i].rows, 1, row_chunks, cases[i].manifest);
        built_free(&b);
        free(tensor);
    }
    /* a layout not recognised: cut every 1 MiB, the same both ways */
    rng = 0x9e3779b97f4a7c15u + 99;
    size_t len = (5u << 20) + 12345;
    uint8_t *raw = (uint8_t *)malloc(len);
    for (size_t k = 0; k < len; k++) raw[k] = (uint8_t)next_rand();
    built b;
    memset(&b, 0, sizeof b);
    emit(&b, raw, 100, 0);
    emit(&b, raw + 100, len - 100, 1);
    check_same("a layout not recognised (1 MiB spans)", &b, 256, 0, 0, 0x480ff13d10bffe2du);
    built_free(&b);
    free(raw);
    printf("kv_slot_test: OK\n");
    return 0;
}
