/* Deliberately broken kv_store_v1 backends for testing `kvwasm check`.
 *
 * Each library wraps the correct native backend (examples/native-backend,
 * compiled in with CFS_ENTRY=cfs_get_vtable) and replaces exactly one
 * vtable entry with a version that breaks exactly one rule of the spec, so
 * the conformance suite must fail exactly the check for that rule. */
#ifndef BROKEN_H
#define BROKEN_H
#include "kv_store_abi.h"

const kv_store_vtable *cfs_get_vtable(void);

/* The correct backend's vtable. */
static const kv_store_vtable *real;

/* Defined by each wrapper: replace one entry of `vt`. */
static void break_one_rule(kv_store_vtable *vt);

__attribute__((visibility("default"))) const kv_store_vtable *kv_store_get_vtable(void) {
    static kv_store_vtable vt;
    if (real == NULL) {
        real = cfs_get_vtable();
        vt = *real;
        break_one_rule(&vt);
    }
    return &vt;
}
#endif
