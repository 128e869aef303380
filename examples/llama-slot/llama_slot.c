/* llama-slot: a real llama.cpp saves a sequence's KV state into a kv_store_v1
 * backend as content-addressed chunks plus a manifest, restores it into a
 * fresh context, and checks the next-token logits bit for bit.
 *
 *   llama-slot [-r ROWS] [-x NEXT] [-o LOGITS] MODEL URI NAME PROMPT
 *   llama-slot -R [-x NEXT] [-o LOGITS] MODEL URI NAME
 *
 * PROMPT and NEXT are token specs: comma-separated SEED:LEN segments, each
 * expanding to LEN pseudo-random token ids (so "7:200,1:24" and "7:200,2:24"
 * share a 200-token prefix). Default NEXT: "99:4".
 *
 * Default (round trip): context A evaluates PROMPT, its sequence state is
 * saved under NAME, then A decodes NEXT (the reference logits, written to
 * LOGITS); context B, fresh, with a fresh store handle, restores NAME and
 * decodes NEXT; exit status 1 unless B's logits equal A's bit for bit.
 * -R (restore only): skip A, restore NAME into a fresh context, decode NEXT
 * and write the logits to LOGITS (to compare across processes and backends).
 *
 * The backend is loaded as llama.cpp's v2 slot code loads it:
 * $KV_STORE_LIBRARY_PATH/libkv_store_<scheme>.so if that file exists, else
 * the bare name through the system loader, RTLD_LOCAL, kv_store_get_vtable.
 * The chunking is described in docs/llama.md. Prints one JSON line. */
#define _GNU_SOURCE
#include <getopt.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define XXH_INLINE_ALL
#include "xxhash.h"

#include "kv_slot.h"
#include "kv_store_loader.h"
#include "llama.h"


static void die(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "llama-slot: ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
    exit(1);
}

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static uint32_t get_u32(const uint8_t *p) {
    uint32_t v = 0;
    for (int i = 0; i < 4; i++) v |= (uint32_t)p[i] << (8 * i);
    return v;
}

/* ---- backend loading, as llama.cpp does it ---- */

/* libkv_store_wasm.so's optional get_chunk into a caller's buffer (NULL for
 * other backends): restores read each chunk straight into place. */
static kv_slot_get_chunk_into_fn get_into;

static const kv_store_vtable *load_backend(const char *uri) {
    char err[4400];
    void *lib = NULL;
    const kv_store_vtable *vt = kv_store_load_lib(uri, &lib, err, sizeof err);
    if (!vt) die("%s", err);
    get_into = (kv_slot_get_chunk_into_fn)kv_store_backend_symbol(lib, vt, KV_SLOT_GET_CHUNK_INTO_SYMBOL);
    return vt;
}

/* ---- token specs ---- */

typedef struct {
    llama_token *ids;
    size_t n;
} tokens_t;

/* "SEED:LEN,SEED:LEN,...": LEN ids from a xorshift64 stream per segment,
 * avoiding the 3 special tokens. */
static tokens_t parse_tokens(const char *spec, int32_t n_vocab) {
    tokens_t t = {NULL, 0};
    char *copy = strdup(spec), *save = NULL;
    for (char *seg = strtok_r(copy, ",", &save); seg; seg = strtok_r(NULL, ",", &save)) {
        unsigned long long seed, len;
        if (sscanf(seg, "%llu:%llu", &seed, &len) != 2 || len == 0 || len > 100000)
            die("bad token spec segment '%s'", seg);
        t.ids = realloc(t.ids, (t.n + len) * sizeof *t.ids);
        uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
        for (unsigned long long i = 0; i < len; i++) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            t.ids[t.n++] = 3 + (llama_token)(x % (uint64_t)(n_vocab - 3));
        }
    }
    free(copy);
    if (t.n == 0) die("empty token spec '%s'", spec);
    return t;
}

/* ---- llama.cpp ---- */

static void quiet_log(enum ggml_log_level level, const char *text, void *user) {
    (void)user;
    if (level >= GGML_LOG_LEVEL_ERROR || getenv("LLAMA_SLOT_VERBOSE")) fputs(text, stderr);
}

static bool no_progress(float progress, void *user) {
    (void)progress;
    (void)user;
    return true;
}

static struct llama_context *new_context(struct llama_model *model) {
    struct llama_context_params p = llama_context_default_params();
    p.n_ctx = 1024;
    p.n_batch = 1024;
    p.n_ubatch = 1024;
    p.n_seq_max = 1;
    /* One thread: logits of a batch can depend on how work is split, and a
     * spinning second thread only slows a shared 2-core machine. */
    p.n_threads = 1;
    p.n_threads_batch = 1;
    /* Flash attention keeps V untransposed: one row per cell, like K, so
     * a prompt prefix is a prefix of every layer's V rows too. */
    p.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_ENABLED;
    p.no_perf = true;
    struct llama_context *ctx = llama_init_from_model(model, p);
    if (!ctx) die("llama_init_from_model failed");
    return ctx;
}

static void decode(struct llama_context *ctx, llama_token *ids, size_t n) {
    if (llama_decode(ctx, llama_batch_get_one(ids, (int32_t)n)) != 0) die("llama_decode failed");
}

/* Decodes `next` one token at a time; returns the logits after each. */
static float *decode_next(struct llama_context *ctx, const tokens_t *next, int32_t n_vocab) {
    float *out = malloc(next->n * (size_t)n_vocab * sizeof(float));
    for (size_t i = 0; i < next->n; i++) {
        decode(ctx, &next->ids[i], 1);
        const float *l = llama_get_logits_ith(ctx, -1);
        if (!l) die("no logits");
        memcpy(out + i * (size_t)n_vocab, l, (size_t)n_vocab * sizeof(float));
    }
    return out;
}

/* ---- save and restore, through the shared kv_slot code ---- */

typedef struct {
    size_t chunks, stored, dedup, bytes;
    double ms;
} save_stats;

static save_stats save(const kv_store_vtable *vt, const char *uri, const char *name, struct llama_context *ctx,
                       const tokens_t *prompt, uint32_t rows) {
    size_t seq = llama_state_seq_get_size(ctx, 0);
    size_t head = KV_SLOT_GGSQ_HEAD + 4 * prompt->n, size = head + seq;
    uint8_t *st = malloc(size);
    kv_slot_write_head(st, LLAMA_STATE_SEQ_MAGIC, LLAMA_STATE_SEQ_VERSION, prompt->ids, prompt->n);
    if (llama_state_seq_get_data(ctx, st + head, seq, 0) != seq) die("llama_state_seq_get_data failed");

    double t0 = now_ms();
    kv_store_v1 *store = vt->open(uri);
    if (!store) die("open(%s) failed", uri);
    kv_slot_save_stats s;
    kv_slot_error err;
    if (kv_slot_save(vt, store, name, st, size, rows, &s, &err) != 0) die("save %s: %s", name, err.msg);
    /* The layout must account for every byte: a state this program cannot
     * cut along its KV rows would not show the prefix dedup it tests. */
    if (!s.rows_layout) die("the sequence state's layout was not recognised (flash attention off?)");
    vt->close(store);
    free(st);
    return (save_stats){s.chunks, s.stored, s.deduplicated, size, now_ms() - t0};
}

typedef struct {
    size_t chunks, bytes, tokens;
    double ms;
} restore_stats;

static restore_stats restore(const kv_store_vtable *vt, const char *uri, const char *name, struct llama_context *ctx) {
    restore_stats r = {0, 0, 0, 0};
    double t0 = now_ms();
    kv_store_v1 *store = vt->open(uri);
    if (!store) die("open(%s) failed", uri);
    kv_slot_buf buf = {NULL, 0};
    size_t size = 0;
    kv_slot_error err;
    if (kv_slot_load_into(vt, get_into, store, name, &buf, &size, &r.chunks, &err) != 0)
        die("restore %s: %s", name, err.msg);
    const uint8_t *st = buf.data;
    vt->close(store);
    if (size < KV_SLOT_GGSQ_HEAD || get_u32(st) != LLAMA_STATE_SEQ_MAGIC || get_u32(st + 4) != LLAMA_STATE_SEQ_VERSION)
        die("restored state has no ggsq v%d header", LLAMA_STATE_SEQ_VERSION);
    size_t head = KV_SLOT_GGSQ_HEAD + 4 * (size_t)get_u32(st + 8);
    if (head > size) die("restored state's token count exceeds its size");
    if (llama_state_seq_set_data(ctx, st + head, size - head, 0) != size - head)
        die("llama_state_seq_set_data failed");
    r.ms = now_ms() - t0;
    r.bytes = size;
    r.tokens = get_u32(st + 8);
    kv_slot_buf_release(&buf);
    return r;
}

static void write_file(const char *path, const void *data, size_t len) {
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(data, 1, len, f) != len || fclose(f) != 0) die("write %s failed", path);
}

int main(int argc, char **argv) {
    uint32_t rows = 32;
    const char *next_spec = "99:4", *logits_path = NULL;
    int restore_only = 0, opt;
    while ((opt = getopt(argc, argv, "r:x:o:R")) != -1) {
        switch (opt) {
        case 'r': rows = (uint32_t)strtoul(optarg, NULL, 10); break;
        case 'x': next_spec = optarg; break;
        case 'o': logits_path = optarg; break;
        case 'R': restore_only = 1; break;
        default: goto usage;
        }
    }
    if (argc - optind != (restore_only ? 3 : 4) || rows == 0) {
    usage:
        fprintf(stderr, "usage: %s [-r ROWS] [-x NEXT] [-o LOGITS] MODEL URI NAME PROMPT\n"
                        "       %s -R [-x NEXT] [-o LOGITS] MODEL URI NAME\n", argv[0], argv[0]);
        return 2;
    }
    const char *model_path = argv[optind], *uri = argv[optind + 1], *name = argv[optind + 2];

    const kv_store_vtable *vt = load_backend(uri);
    llama_log_set(quiet_log, NULL);
    llama_backend_init();
    struct llama_model_params mp = llama_model_default_params();
    mp.progress_callback = no_progress;
    struct llama_model *model = llama_model_load_from_file(model_path, mp);
    if (!model) die("cannot load %s", model_path);
    int32_t n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(model));
    uint32_t n_layer = (uint32_t)llama_model_n_layer(model);
    tokens_t next = parse_tokens(next_spec, n_vocab);
    size_t n_logits = next.n * (size_t)n_vocab;

    if (restore_only) {
        struct llama_context *ctx = new_context(model);
        restore_stats r = restore(vt, uri, name, ctx);
        float *got = decode_next(ctx, &next, n_vocab);
        if (logits_path) write_file(logits_path, got, n_logits * sizeof(float));
        printf("{\"mode\":\"restore\",\"uri\":\"%s\",\"name\":\"%s\",\"tokens\":%zu,\"state_bytes\":%zu,"
               "\"chunks\":%zu,\"restore_ms\":%.2f,\"logits_xxh3\":\"%016" PRIx64 "\"}\n",
               uri, name, r.tokens, r.bytes, r.chunks, r.ms, (uint64_t)XXH3_64bits(got, n_logits * sizeof(float)));
        free(got);
        llama_free(ctx);
    } else {
        tokens_t prompt = parse_tokens(argv[optind + 3], n_vocab);
        struct llama_context *a = new_context(model);
        decode(a, prompt.ids, prompt.n);
        save_stats s = save(vt, uri, name, a, &prompt, rows);
        float *want = decode_next(a, &next, n_vocab);
        llama_free(a);

        struct llama_context *b = new_context(model);
        restore_stats r = restore(vt, uri, name, b);
        float *got = decode_next(b, &next, n_vocab);
        llama_free(b);
        int same = memcmp(want, got, n_logits * sizeof(float)) == 0;
        if (logits_path) write_file(logits_path, want, n_logits * sizeof(float));
        printf("{\"mode\":\"roundtrip\",\"uri\":\"%s\",\"name\":\"%s\",\"tokens\":%zu,\"layers\":%u,"
               "\"rows_per_chunk\":%u,\"state_bytes\":%zu,\"chunks\":%zu,\"stored\":%zu,\"deduplicated\":%zu,"
               "\"save_ms\":%.2f,\"restore_ms\":%.2f,\"logits\":%zu,\"logits_identical\":%s,"
               "\"logits_xxh3\":\"%016" PRIx64 "\"}\n",
               uri, name, prompt.n, n_layer, rows, s.bytes, s.chunks, s.stored, s.dedup, s.ms, r.ms, n_logits,
               same ? "true" : "false", (uint64_t)XXH3_64bits(want, n_logits * sizeof(float)));
        free(want);
        free(got);
        free(prompt.ids);
        if (!same) {
            fprintf(stderr, "llama-slot: logits after the restore differ from the in-memory context's\n");
            return 1;
        }
    }
    free(next.ids);
    llama_model_free(model);
    llama_backend_free();
    return 0;
}
