/* {{name}}: a kv_store_v1 backend as a WebAssembly component, in C.
 *
 * The store keeps chunks and manifests in the memory of the instance
 * serving a namespace (the host gives every namespace its own instance and
 * shares it among the handles open on it; the data is gone when the last
 * one closes). Replace the bodies with calls to your own storage; keep the
 * rules in the comments: they are what wit/kv-store.wit requires of every
 * backend, and what `kvwasm check` tests.
 *
 * The bindings (gen/backend.h, written by build.sh) follow wit-bindgen's C
 * rules: every argument passed by pointer is this code's to keep or free;
 * whatever a function returns is freed by the bindings after the call; a
 * payload lent to a call is released (drop_borrow) before it returns. */

#include <stdlib.h>
#include <string.h>

#include "backend.h"

typedef exports_kvwasm_kv_store_store_error_t error_t_;
typedef backend_list_u8_t bytes_t;

/* A chained hash table from byte strings to byte strings; it owns both. */
typedef struct entry {
    struct entry *next;
    bytes_t key;
    bytes_t value;
} entry;

typedef struct {
    entry **buckets;
    size_t n_buckets;
    size_t count;
} table;

struct exports_kvwasm_kv_store_store_store_t {
    table chunks;
    table manifests;
};

static void bytes_free(bytes_t *b) {
    if (b->len > 0) free(b->ptr);
}

static size_t hash_bytes(const uint8_t *p, size_t len) {
    size_t h = 1469598103934665603ULL & SIZE_MAX; /* FNV-1a */
    for (size_t i = 0; i < len; i++) h = (h ^ p[i]) * 1099511628211ULL;
    return h;
}

static entry **table_slot(table *t, const uint8_t *key, size_t len) {
    if (t->n_buckets == 0) return NULL;
    entry **slot = &t->buckets[hash_bytes(key, len) % t->n_buckets];
    while (*slot && !((*slot)->key.len == len && memcmp((*slot)->key.ptr, key, len) == 0)) {
        slot = &(*slot)->next;
    }
    return slot;
}

static entry *table_get(table *t, const uint8_t *key, size_t len) {
    entry **slot = table_slot(t, key, len);
    return slot ? *slot : NULL;
}

static void table_grow(table *t) {
    size_t n = t->n_buckets ? 2 * t->n_buckets : 64;
    entry **buckets = calloc(n, sizeof *buckets);
    if (!buckets) abort();
    for (size_t i = 0; i < t->n_buckets; i++) {
        for (entry *e = t->buckets[i], *next; e; e = next) {
            next = e->next;
            size_t at = hash_bytes(e->key.ptr, e->key.len) % n;
            e->next = buckets[at];
            buckets[at] = e;
        }
    }
    free(t->buckets);
    t->buckets = buckets;
    t->n_buckets = n;
}

/* Store `value` under `key` (replacing a value there); takes both. */
static void table_put(table *t, bytes_t key, bytes_t value) {
    entry *found = table_get(t, key.ptr, key.len);
    if (found) {
        bytes_free(&key);
        bytes_free(&found->value);
        found->value = value;
        return;
    }
    if (t->count >= 2 * t->n_buckets) table_grow(t);
    entry *e = malloc(sizeof *e);
    if (!e) abort();
    size_t at = hash_bytes(key.ptr, key.len) % t->n_buckets;
    *e = (entry){.next = t->buckets[at], .key = key, .value = value};
    t->buckets[at] = e;
    t->count++;
}

static void table_remove(table *t, const uint8_t *key, size_t len) {
    entry **slot = table_slot(t, key, len);
    if (!slot || !*slot) return;
    entry *e = *slot;
    *slot = e->next;
    bytes_free(&e->key);
    bytes_free(&e->value);
    free(e);
    t->count--;
}

static void table_free(table *t) {
    for (size_t i = 0; i < t->n_buckets; i++) {
        for (entry *e = t->buckets[i], *next; e; e = next) {
            next = e->next;
            bytes_free(&e->key);
            bytes_free(&e->value);
            free(e);
        }
    }
    free(t->buckets);
}

static bool invalid(error_t_ *err, const char *why) {
    err->tag = KVWASM_KV_STORE_TYPES_ERROR_INVALID_ARGUMENT;
    backend_string_dup(&err->val.invalid_argument, why);
    return false;
}

static bool not_found(error_t_ *err) {
    err->tag = KVWASM_KV_STORE_TYPES_ERROR_NOT_FOUND;
    return false;
}

/* Hashes are 1 to 64 bytes. */
static bool hash_ok(const bytes_t *hash) {
    return hash->len >= 1 && hash->len <= 64;
}

/* Manifest names and namespace components are one safe path component:
 * 1 to 255 bytes, not ".", no "..", no '/', '\\' or control character. */
static bool name_ok(const uint8_t *p, size_t len) {
    if (len == 0 || len > 255 || (len == 1 && p[0] == '.')) return false;
    for (size_t i = 0; i < len; i++) {
        uint8_t c = p[i];
        if (c == '/' || c == '\\' || c < 0x20 || c == 0x7f) return false;
        if (c == '.' && i + 1 < len && p[i + 1] == '.') return false;
        if (c == 0xc2 && i + 1 < len && p[i + 1] >= 0x80 && p[i + 1] <= 0x9f) return false;
    }
    return true;
}

/* A payload holding a copy of `b` (the host copies it). */
static exports_kvwasm_kv_store_store_own_payload_t payload_of(bytes_t *b) {
    return kvwasm_kv_store_types_constructor_payload(b);
}

/* The bytes of a lent payload, read into this instance, and the payload
 * released. */
static bytes_t take_payload(exports_kvwasm_kv_store_store_borrow_payload_t data) {
    bytes_t bytes;
    uint64_t len = kvwasm_kv_store_types_method_payload_len(data);
    kvwasm_kv_store_types_method_payload_read(data, 0, len, &bytes);
    kvwasm_kv_store_types_payload_drop_borrow(data);
    return bytes;
}

void exports_kvwasm_kv_store_store_info(exports_kvwasm_kv_store_store_backend_info_t *ret) {
    backend_string_dup(&ret->name, "{{name}}");
    backend_string_dup(&ret->version, "0.1.0");
    /* The data lives in this instance: one instance per namespace. A
     * backend whose data lives in files or a server says true. */
    ret->shared_state = false;
}

bool exports_kvwasm_kv_store_store_static_store_open(backend_string_t *namespace_,
                                                     exports_kvwasm_kv_store_store_own_store_t *ret,
                                                     error_t_ *err) {
    /* The namespace comes from the consumer's URI: never trust it.
     * Namespaces are separate stores; refuse one you cannot keep apart. */
    size_t start = 0;
    bool ok = true;
    for (size_t i = 0; ok && namespace_->len > 0 && i <= namespace_->len; i++) {
        if (i == namespace_->len || namespace_->ptr[i] == '/') {
            ok = name_ok(namespace_->ptr + start, i - start);
            start = i + 1;
        }
    }
    backend_string_free(namespace_);
    if (!ok) return invalid(err, "unsafe namespace");
    exports_kvwasm_kv_store_store_store_t *store = calloc(1, sizeof *store);
    if (!store) abort();
    *ret = exports_kvwasm_kv_store_store_store_new(store);
    return true;
}

void exports_kvwasm_kv_store_store_store_destructor(exports_kvwasm_kv_store_store_store_t *store) {
    table_free(&store->chunks);
    table_free(&store->manifests);
    free(store);
}

bool exports_kvwasm_kv_store_store_method_store_put_chunk(
    exports_kvwasm_kv_store_store_borrow_store_t self, bytes_t *hash,
    exports_kvwasm_kv_store_store_borrow_payload_t data,
    exports_kvwasm_kv_store_store_put_outcome_t *ret, error_t_ *err) {
    if (!hash_ok(hash)) {
        bytes_free(hash);
        kvwasm_kv_store_types_payload_drop_borrow(data);
        return invalid(err, "hash length outside 1..=64");
    }
    if (table_get(&self->chunks, hash->ptr, hash->len)) {
        /* Idempotent: an existing hash writes nothing and reports a hit. */
        bytes_free(hash);
        kvwasm_kv_store_types_payload_drop_borrow(data);
        *ret = EXPORTS_KVWASM_KV_STORE_STORE_PUT_OUTCOME_ALREADY_PRESENT;
        return true;
    }
    table_put(&self->chunks, *hash, take_payload(data));
    *ret = EXPORTS_KVWASM_KV_STORE_STORE_PUT_OUTCOME_STORED;
    return true;
}

bool exports_kvwasm_kv_store_store_method_store_get_chunk(
    exports_kvwasm_kv_store_store_borrow_store_t self, bytes_t *hash,
    exports_kvwasm_kv_store_store_own_payload_t *ret, error_t_ *err) {
    bool valid = hash_ok(hash);
    entry *found = valid ? table_get(&self->chunks, hash->ptr, hash->len) : NULL;
    bytes_free(hash);
    if (!valid) return invalid(err, "hash length outside 1..=64");
    if (!found) return not_found(err);
    *ret = payload_of(&found->value);
    return true;
}

bool exports_kvwasm_kv_store_store_method_store_put_manifest(
    exports_kvwasm_kv_store_store_borrow_store_t self, backend_string_t *name,
    exports_kvwasm_kv_store_store_borrow_payload_t data, error_t_ *err) {
    if (!name_ok(name->ptr, name->len)) {
        backend_string_free(name);
        kvwasm_kv_store_types_payload_drop_borrow(data);
        return invalid(err, "unsafe manifest name");
    }
    /* Chunks are stored in put_chunk, so they are already visible; a
     * buffering backend would flush them here first. */
    bytes_t key = {name->ptr, name->len};
    table_put(&self->manifests, key, take_payload(data));
    return true;
}

bool exports_kvwasm_kv_store_store_method_store_get_manifest(
    exports_kvwasm_kv_store_store_borrow_store_t self, backend_string_t *name,
    exports_kvwasm_kv_store_store_own_payload_t *ret, error_t_ *err) {
    bool valid = name_ok(name->ptr, name->len);
    entry *found = valid ? table_get(&self->manifests, name->ptr, name->len) : NULL;
    backend_string_free(name);
    if (!valid) return invalid(err, "unsafe manifest name");
    if (!found) return not_found(err);
    *ret = payload_of(&found->value);
    return true;
}

bool exports_kvwasm_kv_store_store_method_store_delete_manifest(
    exports_kvwasm_kv_store_store_borrow_store_t self, backend_string_t *name, error_t_ *err) {
    bool valid = name_ok(name->ptr, name->len);
    if (valid) table_remove(&self->manifests, name->ptr, name->len); /* missing is success */
    backend_string_free(name);
    return valid ? true : invalid(err, "unsafe manifest name");
}

bool exports_kvwasm_kv_store_store_method_store_prefetch_chunks(
    exports_kvwasm_kv_store_store_borrow_store_t self, backend_list_list_u8_t *hashes,
    error_t_ *err) {
    (void)self;
    (void)err;
    backend_list_list_u8_free(hashes); /* a hint: a remote backend would batch-fetch here */
    return true;
}

bool exports_kvwasm_kv_store_store_method_store_flush(exports_kvwasm_kv_store_store_borrow_store_t self,
                                                      error_t_ *err) {
    (void)self;
    (void)err;
    return true; /* nothing is buffered */
}
