/* {{name}}: a kv_store_v1 backend as a WebAssembly component, in C.
 *
 * The store keeps chunks and manifests in plain files in the directory the
 * operator grants it (seen at /data), and moves their bytes with
 * kvwasm:kv-store/payload-io: the host reads and writes the files on this
 * component's own descriptor, and the bytes never pass through its memory.
 *
 *   chunks/<hex of hash>              chunks of the empty namespace
 *   manifests/<name>                  its manifests
 *   ns/<a>/ns/<b>/chunks/...          namespace `a/b`
 *
 * Each namespace component is a directory under ns/, so no namespace can
 * name another one's chunks or manifests. Replace the bodies with calls to
 * your own storage; keep the rules in the comments: they are what
 * wit/kv-store.wit requires of every backend, and what `kvwasm check`
 * tests.
 *
 * The bindings (gen/filesystem_backend.h, written by build.sh) follow
 * wit-bindgen's C rules: every argument passed by pointer to an export is
 * this code's to keep or free; arguments of an import stay the caller's;
 * whatever an export returns is freed by the bindings after the call; a
 * payload lent to a call is released (drop_borrow) before it returns. */

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "filesystem_backend.h"

typedef exports_kvwasm_kv_store_store_error_t error_t_;
typedef filesystem_backend_list_u8_t bytes_t;
typedef filesystem_backend_string_t string_t;
typedef wasi_filesystem_types_error_code_t fs_error_t;
typedef wasi_filesystem_types_borrow_descriptor_t dir_t;

/* The namespace's directory, relative to the grant, with a trailing '/'
 * ("" for the empty namespace). */
struct exports_kvwasm_kv_store_store_store_t {
    char *root;
};

static bool invalid(error_t_ *err, const char *why) {
    err->tag = KVWASM_KV_STORE_TYPES_ERROR_INVALID_ARGUMENT;
    filesystem_backend_string_dup(&err->val.invalid_argument, why);
    return false;
}

/* A failed file operation: a missing file is not-found, anything else io. */
static bool fs_failed(error_t_ *err, fs_error_t code, const char *what) {
    if (code == WASI_FILESYSTEM_TYPES_ERROR_CODE_NO_ENTRY) {
        err->tag = KVWASM_KV_STORE_TYPES_ERROR_NOT_FOUND;
        return false;
    }
    char why[128];
    snprintf(why, sizeof why, "%s: wasi:filesystem error-code %d", what, (int)code);
    err->tag = KVWASM_KV_STORE_TYPES_ERROR_IO;
    filesystem_backend_string_dup(&err->val.io, why);
    return false;
}

/* The directory granted at /data, found once per instance. */
static bool data_dir(dir_t *out, error_t_ *err) {
    static bool found;
    static wasi_filesystem_types_own_descriptor_t dir;
    if (!found) {
        wasi_filesystem_preopens_list_tuple2_own_descriptor_string_t dirs;
        wasi_filesystem_preopens_get_directories(&dirs);
        for (size_t i = 0; i < dirs.len; i++) {
            string_t *name = &dirs.ptr[i].f1;
            if (!found && name->len == 5 && memcmp(name->ptr, "/data", 5) == 0) {
                dir = dirs.ptr[i].f0;
                found = true;
            } else {
                wasi_filesystem_types_descriptor_drop_own(dirs.ptr[i].f0);
            }
            filesystem_backend_string_free(name);
        }
        free(dirs.ptr);
    }
    if (!found) {
        err->tag = KVWASM_KV_STORE_TYPES_ERROR_DENIED;
        filesystem_backend_string_dup(&err->val.denied, "no directory granted at /data");
        return false;
    }
    *out = wasi_filesystem_types_borrow_descriptor(dir);
    return true;
}

/* A new string: `a` followed by `b` (of `b_len` bytes). */
static char *join(const char *a, const char *b, size_t b_len) {
    size_t a_len = strlen(a);
    char *out = malloc(a_len + b_len + 1);
    if (!out) abort();
    memcpy(out, a, a_len);
    memcpy(out + a_len, b, b_len);
    out[a_len + b_len] = 0;
    return out;
}

static string_t str(char *s) {
    return (string_t){(uint8_t *)s, strlen(s)};
}

/* Create the directory `path` beneath the grant; one that exists is fine. */
static bool make_dir(dir_t dir, char *path, error_t_ *err) {
    string_t p = str(path);
    fs_error_t code;
    if (wasi_filesystem_types_method_descriptor_create_directory_at(dir, &p, &code) ||
        code == WASI_FILESYSTEM_TYPES_ERROR_CODE_EXIST) {
        return true;
    }
    return fs_failed(err, code, "create directory");
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

/* `<root>chunks/<hex>`, or NULL if the hash is not 1 to 64 bytes. */
static char *chunk_path(const char *root, const bytes_t *hash) {
    if (hash->len < 1 || hash->len > 64) return NULL;
    char hex[129];
    for (size_t i = 0; i < hash->len; i++) snprintf(hex + 2 * i, 3, "%02x", hash->ptr[i]);
    char *dir = join(root, "chunks/", 7);
    char *path = join(dir, hex, 2 * hash->len);
    free(dir);
    return path;
}

/* `<root>manifests/<name>`, or NULL if the name is unsafe. */
static char *manifest_path(const char *root, const string_t *name) {
    if (!name_ok(name->ptr, name->len)) return NULL;
    char *dir = join(root, "manifests/", 10);
    char *path = join(dir, (const char *)name->ptr, name->len);
    free(dir);
    return path;
}

/* Publish `data` at `path` atomically and durably: written to a new
 * temporary file in the same directory, synced, then renamed over it, so a
 * reader finds the old file or the whole new one. Names starting with
 * ".tmp-" are never chunks; concurrent writers pick different ones. */
static bool publish(dir_t dir, char *path, exports_kvwasm_kv_store_store_borrow_payload_t data,
                    error_t_ *err) {
    char suffix[32];
    uint64_t unique;
    arc4random_buf(&unique, sizeof unique);
    snprintf(suffix, sizeof suffix, ".tmp-%016llx", (unsigned long long)unique);
    const char *slash = strrchr(path, '/');
    size_t dir_len = slash ? (size_t)(slash - path) + 1 : 0;
    char *dir_part = join("", path, dir_len);
    char *tmp = join(dir_part, suffix, strlen(suffix));
    free(dir_part);
    string_t t = str(tmp), p = str(path);
    fs_error_t code;
    bool ok = kvwasm_kv_store_payload_io_publish_file(dir, &t, &p, data, true, &code);
    free(tmp);
    return ok ? true : fs_failed(err, code, "publish");
}

/* Read the file at `path` into a new payload (no copy through this
 * instance). */
static bool read_file(dir_t dir, char *path, exports_kvwasm_kv_store_store_own_payload_t *ret,
                      error_t_ *err) {
    string_t p = str(path);
    fs_error_t code;
    if (kvwasm_kv_store_payload_io_read_file(dir, &p, ret, &code)) return true;
    return fs_failed(err, code, "read");
}

void exports_kvwasm_kv_store_store_info(exports_kvwasm_kv_store_store_backend_info_t *ret) {
    filesystem_backend_string_dup(&ret->name, "{{name}}");
    filesystem_backend_string_dup(&ret->version, "0.1.0");
    /* The data lives in files, so several instances may serve one handle. */
    ret->shared_state = true;
}

bool exports_kvwasm_kv_store_store_static_store_open(string_t *namespace_,
                                                     exports_kvwasm_kv_store_store_own_store_t *ret,
                                                     error_t_ *err) {
    /* The namespace comes from the consumer's URI: never trust it. Each
     * component is a directory under ns/, so no namespace can name another
     * one's chunks or manifests directory; an empty component (a//b, /a) or
     * an unsafe one is refused, never merged with another namespace. */
    dir_t dir;
    if (!data_dir(&dir, err)) {
        filesystem_backend_string_free(namespace_);
        return false;
    }
    char *root = join("", "", 0);
    bool ok = true;
    size_t start = 0;
    for (size_t i = 0; ok && namespace_->len > 0 && i <= namespace_->len; i++) {
        if (i == namespace_->len || namespace_->ptr[i] == '/') {
            const uint8_t *part = namespace_->ptr + start;
            size_t len = i - start;
            start = i + 1;
            if (!name_ok(part, len)) {
                ok = invalid(err, "unsafe namespace");
                break;
            }
            char *ns = join(root, "ns", 2);
            free(root);
            ok = make_dir(dir, ns, err);
            root = join(ns, "/", 1);
            free(ns);
            char *named = join(root, (const char *)part, len);
            free(root);
            ok = ok && make_dir(dir, named, err);
            root = join(named, "/", 1);
            free(named);
        }
    }
    filesystem_backend_string_free(namespace_);
    const char *subdirs[] = {"chunks", "manifests"};
    for (size_t i = 0; ok && i < 2; i++) {
        char *sub = join(root, subdirs[i], strlen(subdirs[i]));
        ok = make_dir(dir, sub, err);
        free(sub);
    }
    if (!ok) {
        free(root);
        return false;
    }
    exports_kvwasm_kv_store_store_store_t *store = malloc(sizeof *store);
    if (!store) abort();
    store->root = root;
    *ret = exports_kvwasm_kv_store_store_store_new(store);
    return true;
}

void exports_kvwasm_kv_store_store_store_destructor(exports_kvwasm_kv_store_store_store_t *store) {
    free(store->root);
    free(store);
}

bool exports_kvwasm_kv_store_store_method_store_put_chunk(
    exports_kvwasm_kv_store_store_borrow_store_t self, bytes_t *hash,
    exports_kvwasm_kv_store_store_borrow_payload_t data,
    exports_kvwasm_kv_store_store_put_outcome_t *ret, error_t_ *err) {
    char *path = chunk_path(self->root, hash);
    filesystem_backend_list_u8_free(hash);
    dir_t dir;
    bool ok;
    if (!path) {
        ok = invalid(err, "hash length outside 1..=64");
    } else if (!data_dir(&dir, err)) {
        ok = false;
    } else {
        string_t p = str(path);
        wasi_filesystem_types_descriptor_stat_t stat;
        fs_error_t code;
        if (wasi_filesystem_types_method_descriptor_stat_at(dir, 0, &p, &stat, &code)) {
            /* Idempotent: an existing hash writes nothing and reports a hit. */
            *ret = EXPORTS_KVWASM_KV_STORE_STORE_PUT_OUTCOME_ALREADY_PRESENT;
            ok = true;
        } else if (code != WASI_FILESYSTEM_TYPES_ERROR_CODE_NO_ENTRY) {
            ok = fs_failed(err, code, "stat");
        } else {
            /* Written through (and synced), so it is visible and durable
             * before any manifest names it. */
            ok = publish(dir, path, data, err);
            *ret = EXPORTS_KVWASM_KV_STORE_STORE_PUT_OUTCOME_STORED;
        }
    }
    free(path);
    kvwasm_kv_store_types_payload_drop_borrow(data);
    return ok;
}

bool exports_kvwasm_kv_store_store_method_store_get_chunk(
    exports_kvwasm_kv_store_store_borrow_store_t self, bytes_t *hash,
    exports_kvwasm_kv_store_store_own_payload_t *ret, error_t_ *err) {
    char *path = chunk_path(self->root, hash);
    filesystem_backend_list_u8_free(hash);
    if (!path) return invalid(err, "hash length outside 1..=64");
    dir_t dir;
    bool ok = data_dir(&dir, err) && read_file(dir, path, ret, err);
    free(path);
    return ok;
}

bool exports_kvwasm_kv_store_store_method_store_put_manifest(
    exports_kvwasm_kv_store_store_borrow_store_t self, string_t *name,
    exports_kvwasm_kv_store_store_borrow_payload_t data, error_t_ *err) {
    char *path = manifest_path(self->root, name);
    filesystem_backend_string_free(name);
    dir_t dir;
    bool ok;
    if (!path) {
        ok = invalid(err, "unsafe manifest name");
    } else {
        /* Chunks are written through in put_chunk, so they are already
         * visible; a buffering backend would flush them here first. */
        ok = data_dir(&dir, err) && publish(dir, path, data, err);
    }
    free(path);
    kvwasm_kv_store_types_payload_drop_borrow(data);
    return ok;
}

bool exports_kvwasm_kv_store_store_method_store_get_manifest(
    exports_kvwasm_kv_store_store_borrow_store_t self, string_t *name,
    exports_kvwasm_kv_store_store_own_payload_t *ret, error_t_ *err) {
    char *path = manifest_path(self->root, name);
    filesystem_backend_string_free(name);
    if (!path) return invalid(err, "unsafe manifest name");
    dir_t dir;
    bool ok = data_dir(&dir, err) && read_file(dir, path, ret, err);
    free(path);
    return ok;
}

bool exports_kvwasm_kv_store_store_method_store_delete_manifest(
    exports_kvwasm_kv_store_store_borrow_store_t self, string_t *name, error_t_ *err) {
    char *path = manifest_path(self->root, name);
    filesystem_backend_string_free(name);
    if (!path) return invalid(err, "unsafe manifest name");
    dir_t dir;
    bool ok = data_dir(&dir, err);
    if (ok) {
        string_t p = str(path);
        fs_error_t code;
        if (!wasi_filesystem_types_method_descriptor_unlink_file_at(dir, &p, &code) &&
            code != WASI_FILESYSTEM_TYPES_ERROR_CODE_NO_ENTRY) { /* missing is success */
            ok = fs_failed(err, code, "delete");
        }
    }
    free(path);
    return ok;
}

bool exports_kvwasm_kv_store_store_method_store_prefetch_chunks(
    exports_kvwasm_kv_store_store_borrow_store_t self, filesystem_backend_list_list_u8_t *hashes,
    error_t_ *err) {
    (void)self;
    (void)err;
    filesystem_backend_list_list_u8_free(hashes); /* a hint: a remote backend would batch-fetch here */
    return true;
}

bool exports_kvwasm_kv_store_store_method_store_flush(exports_kvwasm_kv_store_store_borrow_store_t self,
                                                      error_t_ *err) {
    (void)self;
    (void)err;
    return true; /* nothing is buffered */
}
