/* Breaks manifest atomicity: the manifest is published in two steps (first
 * half, then the whole), so a concurrent reader can see a torn value. */
#include <unistd.h>

#include "broken.h"

static int put_manifest(kv_store_v1 *s, const char *name, const uint8_t *d, size_t dl) {
    int rc = real->put_manifest(s, name, d, dl / 2);
    if (rc != 0) return rc;
    usleep(200); /* the window a concurrent reader falls into */
    return real->put_manifest(s, name, d, dl);
}

static void break_one_rule(kv_store_vtable *vt) { vt->put_manifest = put_manifest; }
