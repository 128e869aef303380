/* Loading a kv_store_v1 backend the way llama.cpp does: the URI's scheme
 * names the library (wasm://... -> libkv_store_wasm.so), looked up in
 * $KV_STORE_LIBRARY_PATH first, then by bare name through the system
 * loader, RTLD_LOCAL; then kv_store_get_vtable. Shared by the examples. */
#ifndef KV_STORE_LOADER_H
#define KV_STORE_LOADER_H

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kv_store_abi.h"

/* The backend for `uri`, or NULL with the reason written to `err`; `*dl_out`
 * (if not NULL) gets the library's dlopen handle, for optional
 * symbols a backend exports beside its vtable (dlsym). */
static inline const kv_store_vtable *kv_store_load_lib(const char *uri, void **dl_out, char *err, size_t err_len) {
    const char *sep = strstr(uri, "://");
    if (!sep) {
        snprintf(err, err_len, "URI %s has no scheme", uri);
        return NULL;
    }
    char lib[256];
    snprintf(lib, sizeof lib, "libkv_store_%.*s.so", (int)(sep - uri), uri);

    void *dl = NULL;
    const char *dir = getenv("KV_STORE_LIBRARY_PATH");
    if (dir) {
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", dir, lib);
        if (access(path, F_OK) == 0) dl = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    }
    if (!dl) dl = dlopen(lib, RTLD_NOW | RTLD_LOCAL);
    if (!dl) {
        snprintf(err, err_len, "dlopen %s: %s", lib, dlerror());
        return NULL;
    }
    kv_store_get_vtable_fn get = (kv_store_get_vtable_fn)dlsym(dl, "kv_store_get_vtable");
    if (!get) {
        snprintf(err, err_len, "dlsym kv_store_get_vtable: %s", dlerror());
        return NULL;
    }
    const kv_store_vtable *vt = get();
    if (!vt || vt->version < 1 || !vt->open || !vt->close || !vt->put_chunk || !vt->get_chunk ||
        !vt->put_manifest || !vt->get_manifest || !vt->delete_manifest) {
        snprintf(err, err_len, "%s: unusable vtable (NULL, version < 1 or a NULL v1 entry)", lib);
        return NULL;
    }
    if (dl_out) *dl_out = dl;
    return vt;
}

/* The backend for `uri`, or NULL with the reason written to `err`. */
static inline const kv_store_vtable *kv_store_load(const char *uri, char *err, size_t err_len) {
    return kv_store_load_lib(uri, NULL, err, err_len);
}

/* Symbol `name` of the backend library `dl` whose vtable is `vt` (both from
 * kv_store_load_lib), or NULL. Only the library itself counts: dlsym on its
 * handle also searches the libraries it links, and a backend that wraps
 * libkv_store_wasm.so must not hand out the wrapped library's calls for its
 * own handles. Needs dladdr: define _GNU_SOURCE before any include. */
#ifdef _GNU_SOURCE
static inline void *kv_store_backend_symbol(void *dl, const kv_store_vtable *vt, const char *name) {
    void *sym = dlsym(dl, name);
    Dl_info in_sym, in_vt;
    if (!sym || !dladdr(sym, &in_sym) || !dladdr((const void *)vt, &in_vt) || in_sym.dli_fbase != in_vt.dli_fbase)
        return NULL;
    return sym;
}
#endif

#endif
