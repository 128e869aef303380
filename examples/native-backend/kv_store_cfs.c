/* libkv_store_cfs.so: the spec's C skeleton completed into a real
 * local-filesystem kv_store_v1 backend (vtable version 2).
 *
 * URI:    cfs:///absolute/dir   (trailing '/' trimmed; the directory is created)
 * Layout: the same as llama.cpp's in-tree local store and kvwasm's fs guest:
 *     <dir>/<manifest name>
 *     <dir>/chunks/<first hex digit of hash>/<hex of whole hash>
 *
 * Files are written to a unique temporary name and renamed into place, so a
 * reader never sees a partial file. Durability is ordered like the fs guest:
 * chunks are fsync'ed (with their directories) in one batch before a
 * manifest is written, fsync'ed and renamed. It is both a working native
 * backend and the baseline kvwasm's benchmarks compare the sandbox against.
 *
 * Thread-safe: the only shared mutable state is the list of chunks awaiting
 * fsync (under a mutex) and the temp-file counter (atomic).
 *
 * Build switches, for wrapper libraries that reuse this backend (see
 * tests/broken-backends): CFS_SCHEME names the URI scheme (default "cfs"),
 * CFS_ENTRY the entry function (default kv_store_get_vtable) and CFS_EXPORT
 * its visibility (default: exported; the only exported symbol).
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "kv_store_abi.h"

#ifndef CFS_SCHEME
#define CFS_SCHEME "cfs"
#endif
#ifndef CFS_ENTRY
#define CFS_ENTRY kv_store_get_vtable
#endif
#ifndef CFS_EXPORT
#define CFS_EXPORT __attribute__((visibility("default")))
#endif

#define MAX_HASH_LEN 64
#define MAX_NAME_LEN 255
/* Room under PATH_MAX for "/chunks/x/" plus the longest file name. */
#define ROOT_MAX (PATH_MAX - 512)
#define LOG_PREFIX "kv_store_" CFS_SCHEME ": "

struct pending {
    char **paths; /* chunk files renamed into place, not yet fsync'ed */
    size_t len, cap;
    unsigned dirs; /* bit i: chunks/<i> needs an fsync */
};

struct kv_store_v1 {
    char root[ROOT_MAX];
    pthread_mutex_t lock; /* guards `pending` */
    struct pending pending;
};

static atomic_ulong tmp_counter;

static void logf_(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fputs(LOG_PREFIX, stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
}

/* ---- validation: every input is checked before it reaches a path ---- */

static int valid_hash(const uint8_t *h, size_t hl) {
    if (h == NULL || hl == 0 || hl > MAX_HASH_LEN) {
        logf_("invalid hash (pointer %p, length %zu; want 1..=%d bytes)", (const void *)h, hl,
              MAX_HASH_LEN);
        return 0;
    }
    return 1;
}

/* One safe path component: non-empty, <= 255 bytes, no '/', '\\', control
 * characters or "..", and not ".". */
static int valid_name(const char *name) {
    if (name == NULL) {
        logf_("manifest name is NULL");
        return 0;
    }
    size_t n = strnlen(name, MAX_NAME_LEN + 1);
    if (n == 0 || n > MAX_NAME_LEN) {
        logf_("manifest name rejected: length must be 1..=%d bytes", MAX_NAME_LEN);
        return 0;
    }
    if (strcmp(name, ".") == 0 || strstr(name, "..") != NULL) {
        logf_("manifest name rejected: relative path component");
        return 0;
    }
    for (const unsigned char *p = (const unsigned char *)name; *p; p++) {
        if (*p == '/' || *p == '\\' || *p < 0x20 || *p == 0x7f) {
            logf_("manifest name rejected: contains byte 0x%02x", *p);
            return 0;
        }
    }
    return 1;
}

static int valid_out(uint8_t **out, size_t *out_len) {
    if (out == NULL || out_len == NULL) {
        logf_("output pointer is NULL");
        return 0;
    }
    return 1;
}

/* ---- paths ---- */

static void hex(const uint8_t *h, size_t hl, char *out) {
    static const char digits[] = "0123456789abcdef";
    for (size_t i = 0; i < hl; i++) {
        out[2 * i] = digits[h[i] >> 4];
        out[2 * i + 1] = digits[h[i] & 15];
    }
    out[2 * hl] = '\0';
}

static int chunk_dir(const kv_store_v1 *s, const char *hexname, char *out) {
    return snprintf(out, PATH_MAX, "%s/chunks/%c", s->root, hexname[0]) < PATH_MAX ? 0 : -1;
}

static int join(char *out, const char *dir, const char *name) {
    if (snprintf(out, PATH_MAX, "%s/%s", dir, name) >= PATH_MAX) {
        logf_("path too long under %s", dir);
        return -1;
    }
    return 0;
}

static int mkdir_p(char *path) {
    for (char *p = path + 1; *p; p++) {
        if (*p != '/') continue;
        *p = '\0';
        int rc = mkdir(path, 0755);
        *p = '/';
        if (rc != 0 && errno != EEXIST) return -1;
    }
    return mkdir(path, 0755) == 0 || errno == EEXIST ? 0 : -1;
}

static int fsync_path(const char *path, int flags) {
    int fd = open(path, flags | O_CLOEXEC);
    if (fd < 0) return -1;
    int rc = (flags & O_DIRECTORY) ? fsync(fd) : fdatasync(fd);
    close(fd);
    return rc;
}

/* ---- file I/O ---- */

/* Write `data` to a fresh temp file in `dir`, then rename it to `path`.
 * `durable` fsyncs the file before the rename. */
static int write_atomic(const char *dir, const char *path, const uint8_t *data, size_t len,
                        int durable) {
    char tmp[PATH_MAX];
    unsigned long seq = atomic_fetch_add(&tmp_counter, 1);
    if (snprintf(tmp, sizeof tmp, "%s/.cfs-tmp-%d-%lu", dir, (int)getpid(), seq) >= PATH_MAX) {
        logf_("path too long under %s", dir);
        return -1;
    }
    int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd < 0) {
        logf_("create %s: %s", tmp, strerror(errno));
        return -1;
    }
    size_t done = 0;
    while (done < len) {
        ssize_t n = write(fd, data + done, len - done);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) {
            logf_("write %s: %s", tmp, strerror(errno));
            close(fd);
            unlink(tmp);
            return -1;
        }
        done += (size_t)n;
    }
    if (durable && fdatasync(fd) != 0) {
        logf_("fsync %s: %s", tmp, strerror(errno));
        close(fd);
        unlink(tmp);
        return -1;
    }
    close(fd);
    if (rename(tmp, path) != 0) {
        logf_("rename %s: %s", path, strerror(errno));
        unlink(tmp);
        return -1;
    }
    return 0;
}

/* Read a whole file into a malloc'd buffer. Returns -2 when it is missing. */
static int read_whole(const char *path, uint8_t **out, size_t *out_len) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return errno == ENOENT ? -2 : -1;
    struct stat st;
    if (fstat(fd, &st) != 0) {
        close(fd);
        return -1;
    }
    size_t len = (size_t)st.st_size;
    uint8_t *buf = malloc(len ? len : 1);
    if (buf == NULL) {
        close(fd);
        logf_("out of memory for %zu bytes", len);
        return -1;
    }
    size_t done = 0;
    while (done < len) {
        ssize_t n = pread(fd, buf + done, len - done, (off_t)done);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) {
            logf_("read %s: %s", path, n < 0 ? strerror(errno) : "file shrank");
            free(buf);
            close(fd);
            return -1;
        }
        done += (size_t)n;
    }
    close(fd);
    *out = buf;
    *out_len = len;
    return 0;
}

/* fsync every chunk written since the last manifest, then their directories. */
static int flush_pending(kv_store_v1 *s) {
    pthread_mutex_lock(&s->lock);
    struct pending p = s->pending;
    memset(&s->pending, 0, sizeof s->pending);
    pthread_mutex_unlock(&s->lock);

    int rc = 0;
    for (size_t i = 0; i < p.len; i++) {
        if (rc == 0 && fsync_path(p.paths[i], O_RDONLY) != 0) {
            logf_("fsync %s: %s", p.paths[i], strerror(errno));
            rc = -1;
        }
        free(p.paths[i]);
    }
    free(p.paths);
    char dir[PATH_MAX];
    for (unsigned i = 0; rc == 0 && i < 16; i++) {
        if (!(p.dirs & (1u << i))) continue;
        snprintf(dir, sizeof dir, "%s/chunks/%x", s->root, i);
        if (fsync_path(dir, O_RDONLY | O_DIRECTORY) != 0) rc = -1;
    }
    if (rc == 0 && p.dirs) {
        snprintf(dir, sizeof dir, "%s/chunks", s->root);
        if (fsync_path(dir, O_RDONLY | O_DIRECTORY) != 0) rc = -1;
    }
    return rc;
}

/* ---- the vtable ---- */

static kv_store_v1 *cfs_open(const char *uri) {
    static const char prefix[] = CFS_SCHEME "://";
    if (uri == NULL || strncmp(uri, prefix, sizeof prefix - 1) != 0) {
        logf_("URI must look like %s/absolute/dir", prefix);
        return NULL;
    }
    const char *path = uri + sizeof prefix - 1;
    size_t n = strlen(path);
    while (n > 1 && path[n - 1] == '/') n--;
    if (n == 0 || path[0] != '/' || n >= ROOT_MAX) {
        logf_("URI must name an absolute directory: %s", uri);
        return NULL;
    }
    kv_store_v1 *s = calloc(1, sizeof *s);
    if (s == NULL) return NULL;
    memcpy(s->root, path, n);
    s->root[n] = '\0';
    char dirs[PATH_MAX];
    snprintf(dirs, sizeof dirs, "%s/chunks", s->root);
    if (mkdir_p(dirs) != 0) {
        logf_("create %s: %s", dirs, strerror(errno));
        free(s);
        return NULL;
    }
    pthread_mutex_init(&s->lock, NULL);
    return s;
}

static void cfs_close(kv_store_v1 *s) {
    if (s == NULL) return;
    for (size_t i = 0; i < s->pending.len; i++) free(s->pending.paths[i]);
    free(s->pending.paths);
    pthread_mutex_destroy(&s->lock);
    free(s);
}

static int cfs_put_chunk(kv_store_v1 *s, const uint8_t *h, size_t hl, const uint8_t *d,
                         size_t dl) {
    if (s == NULL || !valid_hash(h, hl)) return -1;
    if (d == NULL && dl != 0) {
        logf_("put_chunk: data is NULL with length %zu", dl);
        return -1;
    }
    char name[2 * MAX_HASH_LEN + 1], dir[PATH_MAX], path[PATH_MAX];
    hex(h, hl, name);
    if (chunk_dir(s, name, dir) != 0 || join(path, dir, name) != 0) return -1;

    /* Present when a file of the right size is there; a short file left by
     * a crash between rename and fsync is rewritten, not trusted. */
    struct stat st;
    if (stat(path, &st) == 0 && (size_t)st.st_size == dl) return 1;
    if (mkdir(dir, 0755) != 0 && errno != EEXIST) {
        logf_("create %s: %s", dir, strerror(errno));
        return -1;
    }
    if (write_atomic(dir, path, d, dl, 0) != 0) return -1;

    char *copy = strdup(path);
    pthread_mutex_lock(&s->lock);
    struct pending *p = &s->pending;
    if (copy != NULL && p->len == p->cap) {
        size_t cap = p->cap ? 2 * p->cap : 64;
        char **grown = realloc(p->paths, cap * sizeof *grown);
        if (grown != NULL) {
            p->paths = grown;
            p->cap = cap;
        }
    }
    int queued = copy != NULL && p->len < p->cap;
    if (queued) {
        p->paths[p->len++] = copy;
        p->dirs |= 1u << (unsigned)(name[0] <= '9' ? name[0] - '0' : name[0] - 'a' + 10);
    }
    pthread_mutex_unlock(&s->lock);
    if (!queued) {
        /* Cannot remember it for the batch: make it durable now. */
        free(copy);
        if (fsync_path(path, O_RDONLY) != 0 || fsync_path(dir, O_RDONLY | O_DIRECTORY) != 0) {
            logf_("fsync %s: %s", path, strerror(errno));
            return -1;
        }
    }
    return 0;
}

static int cfs_get_chunk(kv_store_v1 *s, const uint8_t *h, size_t hl, uint8_t **out,
                         size_t *out_len) {
    if (s == NULL || !valid_hash(h, hl) || !valid_out(out, out_len)) return -1;
    char name[2 * MAX_HASH_LEN + 1], dir[PATH_MAX], path[PATH_MAX];
    hex(h, hl, name);
    if (chunk_dir(s, name, dir) != 0 || join(path, dir, name) != 0) return -1;
    int rc = read_whole(path, out, out_len);
    if (rc == -2) rc = -1; /* missing: a plain miss, the consumer's normal case */
    return rc;
}

static int cfs_put_manifest(kv_store_v1 *s, const char *name, const uint8_t *d, size_t dl) {
    if (s == NULL || !valid_name(name)) return -1;
    if (d == NULL && dl != 0) {
        logf_("put_manifest: data is NULL with length %zu", dl);
        return -1;
    }
    char path[PATH_MAX];
    if (join(path, s->root, name) != 0) return -1;
    /* Every chunk put on this handle must be durable before the manifest
     * that may name it becomes visible. */
    if (flush_pending(s) != 0) return -1;
    if (write_atomic(s->root, path, d, dl, 1) != 0) return -1;
    return fsync_path(s->root, O_RDONLY | O_DIRECTORY) == 0 ? 0 : -1;
}

static int cfs_get_manifest(kv_store_v1 *s, const char *name, uint8_t **out, size_t *out_len) {
    if (s == NULL || !valid_name(name) || !valid_out(out, out_len)) return -1;
    char path[PATH_MAX];
    if (join(path, s->root, name) != 0) return -1;
    int rc = read_whole(path, out, out_len);
    return rc == -2 ? -1 : rc;
}

static int cfs_delete_manifest(kv_store_v1 *s, const char *name) {
    if (s == NULL || !valid_name(name)) return -1;
    char path[PATH_MAX];
    if (join(path, s->root, name) != 0) return -1;
    if (unlink(path) != 0 && errno != ENOENT) {
        logf_("delete %s: %s", path, strerror(errno));
        return -1;
    }
    return 0;
}

/* Start reading every chunk into the page cache; missing ones are skipped
 * (the get that follows reports them). */
static int cfs_prefetch_chunks(kv_store_v1 *s, const uint8_t *hashes, size_t hl, size_t n) {
    if (s == NULL) return -1;
    if (n == 0) return 0;
    if (!valid_hash(hashes, hl)) return -1;
    char name[2 * MAX_HASH_LEN + 1], dir[PATH_MAX], path[PATH_MAX];
    for (size_t i = 0; i < n; i++) {
        hex(hashes + i * hl, hl, name);
        if (chunk_dir(s, name, dir) != 0 || join(path, dir, name) != 0) return -1;
        int fd = open(path, O_RDONLY | O_CLOEXEC);
        if (fd < 0) continue;
        posix_fadvise(fd, 0, 0, POSIX_FADV_WILLNEED);
        close(fd);
    }
    return 0;
}

static const kv_store_vtable VT = {
    .version = 2,
    .open = cfs_open,
    .close = cfs_close,
    .put_chunk = cfs_put_chunk,
    .get_chunk = cfs_get_chunk,
    .put_manifest = cfs_put_manifest,
    .get_manifest = cfs_get_manifest,
    .delete_manifest = cfs_delete_manifest,
    .prefetch_chunks = cfs_prefetch_chunks,
};

CFS_EXPORT const kv_store_vtable *CFS_ENTRY(void) { return &VT; }
