/* kv_store_v1: the vendor-neutral C ABI between an inference engine and a
 * KV-state storage backend (vtable version 2). */
#ifndef KV_STORE_ABI_H
#define KV_STORE_ABI_H

#include <stddef.h>
#include <stdint.h>

typedef struct kv_store_v1 kv_store_v1;

typedef struct {
    uint32_t version; /* 1 today; 2 if prefetch_chunks is non-NULL */

    kv_store_v1 *(*open)(const char *uri);
    void (*close)(kv_store_v1 *self);

    int (*put_chunk)(kv_store_v1 *self, const uint8_t *hash, size_t hash_len,
                     const uint8_t *data, size_t data_len);
    int (*get_chunk)(kv_store_v1 *self, const uint8_t *hash, size_t hash_len,
                     uint8_t **out_data, size_t *out_len);
    int (*put_manifest)(kv_store_v1 *self, const char *name,
                        const uint8_t *data, size_t data_len);
    int (*get_manifest)(kv_store_v1 *self, const char *name,
                        uint8_t **out_data, size_t *out_len);
    int (*delete_manifest)(kv_store_v1 *self, const char *name);

    /* version 2 */
    int (*prefetch_chunks)(kv_store_v1 *self, const uint8_t *hashes,
                           size_t hash_len, size_t n_hashes);
} kv_store_vtable;

typedef const kv_store_vtable *(*kv_store_get_vtable_fn)(void);

#endif
