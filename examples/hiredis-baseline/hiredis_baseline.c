/* The C Redis client `kvwasm bench --remote --hiredis` measures kvwasm's
 * builtin:redis against: what a native kv_store_v1 backend written on
 * hiredis would do, on one connection.
 *
 * save:    one pipeline of `SET <chunk key> <value> NX` (each reply says
 *          whether the chunk was new: put_chunk's 0 or 1), then `SET` of
 *          the manifest.
 * restore: `GET` of the manifest, one pipeline of `GET`s of the chunks it
 *          names, each value copied into a malloc'd buffer (as a consumer
 *          receives it from kv_store_v1) and freed.
 *
 * Keys are named as the remote guests name them: `<base>/chunks/<hash in
 * hex>` and `<base>/manifests/bench`. Errors: a negative return and a
 * message in the caller's buffer. */
#define _POSIX_C_SOURCE 200809L
#include <hiredis/hiredis.h>
#include <stdarg.h>
#include <sys/time.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define EXPORT __attribute__((visibility("default")))

static void fail(char *err, size_t err_len, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    if (err_len) vsnprintf(err, err_len, fmt, ap);
    va_end(ap);
}

/* `<base>/chunks/<hex of hash>` into `out` (room for it). */
static size_t chunk_key(char *out, const char *base, const uint8_t *hash, size_t hash_len) {
    static const char hex[] = "0123456789abcdef";
    size_t n = (size_t)sprintf(out, "%s/chunks/", base);
    for (size_t i = 0; i < hash_len; i++) {
        out[n++] = hex[hash[i] >> 4];
        out[n++] = hex[hash[i] & 15];
    }
    out[n] = 0;
    return n;
}

/* The text of a reply that is not what was expected. */
static const char *reply_text(const redisReply *r, const redisContext *c) {
    if (!r) return c->errstr;
    if (r->type == REDIS_REPLY_ERROR) return r->str;
    return r->type == REDIS_REPLY_NIL ? "no such key" : "unexpected reply type";
}

/* Whether a hash length is one kv_store_v1 allows. */
static int hash_len_ok(size_t hash_len, char *err, size_t err_len) {
    if (hash_len >= 1 && hash_len <= 64) return 1;
    fail(err, err_len, "hash length %zu is not 1 to 64", hash_len);
    return 0;
}

/* A connection to `host:port`, authenticated with `password` if not NULL;
 * NULL on failure. */
EXPORT void *kvb_hiredis_connect(const char *host, int port, const char *password, char *err,
                                 size_t err_len) {
    /* A server that does not answer fails the bench, not hangs it. */
    struct timeval connect_timeout = {5, 0}, io_timeout = {60, 0};
    redisContext *c = redisConnectWithTimeout(host, port, connect_timeout);
    if (!c || c->err) {
        fail(err, err_len, "connect %s:%d: %s", host, port, c ? c->errstr : "out of memory");
        if (c) redisFree(c);
        return NULL;
    }
    if (redisSetTimeout(c, io_timeout) != REDIS_OK) {
        fail(err, err_len, "connect %s:%d: cannot set a timeout: %s", host, port, c->errstr);
        redisFree(c);
        return NULL;
    }
    if (password) {
        redisReply *r = redisCommand(c, "AUTH %s", password);
        int ok = r && r->type == REDIS_REPLY_STATUS;
        if (!ok) fail(err, err_len, "AUTH: %s", reply_text(r, c));
        if (r) freeReplyObject(r);
        if (!ok) {
            redisFree(c);
            return NULL;
        }
    }
    return c;
}

EXPORT void kvb_hiredis_free(void *conn) {
    if (conn) redisFree(conn);
}

/* Save `count` chunks named by `hashes` (`hash_len` bytes each), each of
 * the `len` bytes at `data`, then the manifest. Returns how many chunks
 * were new, or -1. */
EXPORT long kvb_hiredis_save(void *conn, const char *base, const uint8_t *hashes, size_t count,
                             size_t hash_len, const uint8_t *data, size_t len,
                             const uint8_t *manifest, size_t manifest_len, char *err,
                             size_t err_len) {
    redisContext *c = conn;
    if (!hash_len_ok(hash_len, err, err_len)) return -1;
    size_t key_room = strlen(base) + 16 + 2 * hash_len;
    char *key = malloc(key_room);
    if (!key) {
        fail(err, err_len, "out of memory");
        return -1;
    }
    for (size_t i = 0; i < count; i++) {
        size_t key_len = chunk_key(key, base, hashes + i * hash_len, hash_len);
        const char *argv[] = {"SET", key, (const char *)data, "NX"};
        size_t argl[] = {3, key_len, len, 2};
        if (redisAppendCommandArgv(c, 4, argv, argl) != REDIS_OK) {
            fail(err, err_len, "SET NX: %s", c->errstr);
            free(key);
            return -1;
        }
    }
    free(key);
    long stored = 0;
    for (size_t i = 0; i < count; i++) {
        redisReply *r;
        if (redisGetReply(c, (void **)&r) != REDIS_OK) {
            fail(err, err_len, "SET NX: %s", c->errstr);
            return -1;
        }
        if (r->type == REDIS_REPLY_ERROR) {
            fail(err, err_len, "SET NX: %s", r->str);
            freeReplyObject(r);
            /* Drain the pipeline so the connection stays usable. */
            for (size_t j = i + 1; j < count; j++)
                if (redisGetReply(c, (void **)&r) == REDIS_OK) freeReplyObject(r);
            return -1;
        }
        stored += r->type == REDIS_REPLY_STATUS;
        freeReplyObject(r);
    }
    redisReply *r = redisCommand(c, "SET %s/manifests/bench %b", base, manifest, manifest_len);
    int ok = r && r->type == REDIS_REPLY_STATUS;
    if (!ok) fail(err, err_len, "SET manifest: %s", reply_text(r, c));
    if (r) freeReplyObject(r);
    return ok ? stored : -1;
}

/* Restore what `kvb_hiredis_save` saved under `base`: every chunk must
 * have `len` bytes and, if `expect` is not NULL, equal its `len` bytes.
 * Returns how many chunks were restored, or -1. */
EXPORT long kvb_hiredis_restore(void *conn, const char *base, size_t hash_len, size_t len,
                                const uint8_t *expect, char *err, size_t err_len) {
    redisContext *c = conn;
    if (!hash_len_ok(hash_len, err, err_len)) return -1;
    redisReply *m = redisCommand(c, "GET %s/manifests/bench", base);
    if (!m || m->type != REDIS_REPLY_STRING || m->len % hash_len) {
        fail(err, err_len, "GET manifest: %s",
             m && m->type == REDIS_REPLY_STRING ? "not a whole number of hashes" : reply_text(m, c));
        if (m) freeReplyObject(m);
        return -1;
    }
    size_t count = m->len / hash_len;
    char *key = malloc(strlen(base) + 16 + 2 * hash_len);
    if (!key) {
        fail(err, err_len, "out of memory");
        freeReplyObject(m);
        return -1;
    }
    int sent = 1;
    for (size_t i = 0; i < count && sent; i++) {
        size_t key_len = chunk_key(key, base, (const uint8_t *)m->str + i * hash_len, hash_len);
        const char *argv[] = {"GET", key};
        size_t argl[] = {3, key_len};
        sent = redisAppendCommandArgv(c, 2, argv, argl) == REDIS_OK;
    }
    free(key);
    freeReplyObject(m);
    if (!sent) {
        fail(err, err_len, "GET: %s", c->errstr);
        return -1;
    }
    long restored = 0;
    for (size_t i = 0; i < count; i++) {
        redisReply *r;
        if (redisGetReply(c, (void **)&r) != REDIS_OK) {
            fail(err, err_len, "GET: %s", c->errstr);
            return -1;
        }
        int ok = r->type == REDIS_REPLY_STRING && r->len == len;
        char *value = ok ? malloc(r->len) : NULL;
        if (value) {
            memcpy(value, r->str, r->len);
            if (expect && memcmp(value, expect, len) != 0) ok = 0;
            free(value);
            if (!ok) fail(err, err_len, "GET: chunk %zu is not the %zu bytes saved", i, len);
        } else if (ok) {
            ok = 0;
            fail(err, err_len, "out of memory");
        } else if (r->type == REDIS_REPLY_STRING) {
            fail(err, err_len, "GET: chunk %zu has %zu bytes, not %zu", i, r->len, len);
        } else {
            fail(err, err_len, "GET: chunk %zu: %s", i, reply_text(r, c));
        }
        freeReplyObject(r);
        if (!ok) {
            /* Drain the pipeline so the connection stays usable. */
            for (size_t j = i + 1; j < count; j++)
                if (redisGetReply(c, (void **)&r) == REDIS_OK) freeReplyObject(r);
            return -1;
        }
        restored++;
    }
    return restored;
}
