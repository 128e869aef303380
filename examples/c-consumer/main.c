/* A kv_store_v1 consumer that loads a backend exactly as llama.cpp's v2 slot
 * save does, saves an object as xxh3-64-addressed chunks plus a manifest,
 * restores it with prefetch_chunks + get_chunk, and verifies every byte.
 *
 *   c-consumer [-n OBJECT_BYTES] [-c CHUNK_BYTES] [-k HASH_LEN] [-m NAME] URI
 *
 * Loading: $KV_STORE_LIBRARY_PATH/libkv_store_<scheme>.so if that file
 * exists, else the bare name through the system loader (RTLD_LOCAL).
 * With -k other than 8, keys are the first HASH_LEN bytes of xxh3-64 digests
 * with seeds 0, 1, 2, ... (to exercise other hash lengths, e.g. oMLX's 32).
 * Exit status: 0 when every check passed. */
#define _GNU_SOURCE
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "kv_store_loader.h"

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static const kv_store_vtable *load_backend(const char *uri) {
    char err[4400];
    const kv_store_vtable *vt = kv_store_load(uri, err, sizeof err);
    if (!vt) {
        fprintf(stderr, "%s\n", err);
        return NULL;
    }
    printf("loaded a backend for %s: vtable version %u%s\n", uri, vt->version,
           vt->version >= 2 && vt->prefetch_chunks ? " (prefetch_chunks)" : "");
    return vt;
}

static void make_key(const uint8_t *data, size_t len, size_t hash_len, uint8_t *key) {
    for (size_t off = 0, seed = 0; off < hash_len; off += 8, seed++) {
        XXH64_hash_t h = XXH3_64bits_withSeed(data, len, seed);
        uint8_t le[8];
        for (int i = 0; i < 8; i++) le[i] = (uint8_t)(h >> (8 * i));
        memcpy(key + off, le, hash_len - off < 8 ? hash_len - off : 8);
    }
}

#define CHECK(cond, ...)                                   \
    do {                                                   \
        if (!(cond)) {                                     \
            fprintf(stderr, "FAILED: " __VA_ARGS__);       \
            fprintf(stderr, "\n");                         \
            return 1;                                      \
        }                                                  \
    } while (0)

int main(int argc, char **argv) {
    size_t object_len = 5 * 1024 * 1024 + 123, chunk_len = 1024 * 1024, hash_len = 8;
    const char *name = "c-consumer.slot";
    int opt;
    while ((opt = getopt(argc, argv, "n:c:k:m:")) != -1) {
        switch (opt) {
        case 'n': object_len = strtoull(optarg, NULL, 10); break;
        case 'c': chunk_len = strtoull(optarg, NULL, 10); break;
        case 'k': hash_len = strtoull(optarg, NULL, 10); break;
        case 'm': name = optarg; break;
        default: goto usage;
        }
    }
    if (optind != argc - 1 || hash_len < 1 || hash_len > 64 || (chunk_len == 0 && object_len != 0)) {
    usage:
        fprintf(stderr, "usage: %s [-n OBJECT_BYTES] [-c CHUNK_BYTES] [-k HASH_LEN 1..64] [-m NAME] URI\n", argv[0]);
        return 2;
    }
    const char *uri = argv[optind];

    const kv_store_vtable *vt = load_backend(uri);
    if (!vt) return 1;
    kv_store_v1 *store = vt->open(uri);
    CHECK(store, "open(%s) returned NULL", uri);

    /* The object: deterministic bytes, cut into chunks (at least one). */
    size_t n_chunks = object_len == 0 ? 1 : (object_len + chunk_len - 1) / chunk_len;
    uint8_t *object = malloc(object_len ? object_len : 1);
    uint8_t *keys = malloc(n_chunks * hash_len);
    CHECK(object && keys, "out of memory");
    uint64_t x = 0x9E3779B97F4A7C15ull;
    for (size_t i = 0; i < object_len; i++) {
        x ^= x << 13; x ^= x >> 7; x ^= x << 17;
        object[i] = (uint8_t)x;
    }

    double t0 = now_ms();
    int stored = 0, dups = 0;
    for (size_t i = 0; i < n_chunks; i++) {
        size_t off = i * chunk_len, len = object_len - off < chunk_len ? object_len - off : chunk_len;
        make_key(object + off, len, hash_len, keys + i * hash_len);
        int rc = vt->put_chunk(store, keys + i * hash_len, hash_len, object + off, len);
        CHECK(rc >= 0, "put_chunk %zu returned %d", i, rc);
        rc == 1 ? dups++ : stored++;
    }
    int rc = vt->put_manifest(store, name, keys, n_chunks * hash_len);
    CHECK(rc == 0, "put_manifest returned %d", rc);
    double t_save = now_ms() - t0;
    printf("saved %s: %zu bytes in %zu chunks (%d stored, %d dedup hits), %zu-byte keys, %.1f ms\n",
           name, object_len, n_chunks, stored, dups, hash_len, t_save);

    /* Restore, as llama.cpp does on slot load. */
    t0 = now_ms();
    uint8_t *manifest = NULL;
    size_t manifest_len = 0;
    rc = vt->get_manifest(store, name, &manifest, &manifest_len);
    CHECK(rc == 0, "get_manifest returned %d", rc);
    CHECK(manifest_len == n_chunks * hash_len && memcmp(manifest, keys, manifest_len) == 0, "manifest differs");
    if (vt->version >= 2 && vt->prefetch_chunks) {
        rc = vt->prefetch_chunks(store, manifest, hash_len, n_chunks);
        if (rc < 0) printf("prefetch_chunks returned %d; falling back to plain gets\n", rc);
    }
    size_t restored = 0;
    for (size_t i = 0; i < n_chunks; i++) {
        uint8_t *data = NULL;
        size_t len = 0;
        rc = vt->get_chunk(store, manifest + i * hash_len, hash_len, &data, &len);
        CHECK(rc == 0, "get_chunk %zu returned %d", i, rc);
        size_t off = i * chunk_len, want = object_len - off < chunk_len ? object_len - off : chunk_len;
        CHECK(len == want && memcmp(data, object + off, len) == 0, "chunk %zu differs", i);
        restored += len;
        free(data); /* outputs come from malloc */
    }
    free(manifest);
    double t_restore = now_ms() - t0;
    printf("restored %s: %zu bytes, every byte verified, %.1f ms\n", name, restored, t_restore);

    /* Saving the same object again writes nothing new. */
    for (size_t i = 0; i < n_chunks; i++) {
        size_t off = i * chunk_len, len = object_len - off < chunk_len ? object_len - off : chunk_len;
        rc = vt->put_chunk(store, keys + i * hash_len, hash_len, object + off, len);
        CHECK(rc == 1, "re-put of chunk %zu returned %d, expected 1 (dedup)", i, rc);
    }
    printf("saved again: all %zu chunks were dedup hits\n", n_chunks);

    uint8_t *missing = NULL;
    size_t missing_len = 0;
    CHECK(vt->get_manifest(store, "no-such-manifest", &missing, &missing_len) < 0, "missing manifest found");
    CHECK(vt->delete_manifest(store, "no-such-manifest") == 0, "deleting a missing manifest failed");

    vt->close(store);
    free(object);
    free(keys);
    printf("OK\n");
    return 0;
}
