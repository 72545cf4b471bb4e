/*
 * cutfs: a pass-through FUSE file system that can lose power.
 *
 *   cutfs BACKING MOUNTPOINT [--mode drop|tear] [--seed N] [FUSE options]
 *
 * Runs in the foreground (multithreaded; one mutex serialises every
 * operation) and mirrors BACKING at MOUNTPOINT, with a disk's write cache in
 * between:
 *
 * - Metadata operations (create, mkdir, mknod, unlink, rmdir, rename, link,
 *   symlink, chmod, chown, utimens, truncate/ftruncate, O_TRUNC) are applied
 *   to BACKING at once: the metadata journal is taken as always durable.
 *   getattr, readdir, statfs and access pass through, except that a file's
 *   size counts its unsynced writes (max of the backing size and the end of
 *   the furthest write).
 * - Data writes are not written to BACKING: they are kept in memory per file
 *   in 512-byte sectors (a partial sector is merged with the file's current
 *   content when it is first dirtied). Reads return the backing content with
 *   the unsynced sectors laid over it. The kernel page cache works as usual
 *   (no direct_io; writes are write-through, so reads and mmap'ed reads after
 *   a write see it).
 * - The dirty sectors belong to the file, not to its name: they are kept per
 *   backing inode (device + inode number, and an open descriptor of the
 *   backing file), so a rename moves them with the file and a file replaced
 *   or unlinked loses them (a file with no name left cannot be seen after a
 *   power cut anyway).
 * - fsync/fdatasync of a file writes that file's dirty sectors to BACKING and
 *   forgets them. close/flush does not. fsyncdir is a no-op (metadata is
 *   already durable). A write through a handle opened with O_SYNC or O_DSYNC
 *   goes to BACKING at once (the kernel then also sends an fsync for that
 *   handle; FUSE's fsync carries no byte range, so that syncs the whole file:
 *   more durable than a real disk, never less).
 *
 * The cut: SIGUSR1 makes the file system lose power. With --mode drop every
 * unsynced sector is discarded; with --mode tear a random half of them
 * (chosen and ordered by --seed) reaches BACKING, in random order, as when
 * power fails during writeback, and the rest is discarded. Then it prints
 * "cutfs: cut done ..." to stderr, and from then on every operation fails
 * with EIO; it waits to be unmounted (fusermount3 -u, or umount -l).
 * Leaving without a cut (unmounted, SIGTERM) cuts first, in the same mode:
 * unsynced data never reaches BACKING in any other way.
 *
 * On exit it prints its counters to stderr ("cutfs: stats ...").
 *
 * Build: gcc -O2 -Wall cutfs.c $(pkg-config --cflags --libs fuse3) -o cutfs
 */
#define FUSE_USE_VERSION 31
#define _GNU_SOURCE

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <fuse.h>
#include <inttypes.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/time.h>
#include <sys/types.h>
#include <unistd.h>

#define SECTOR 512

struct node {
    dev_t dev;
    ino_t ino;
    int fd;              /* backing file, O_RDWR */
    int handles;         /* open handles */
    int in_map;          /* still reachable by a name */
    off_t size;          /* logical size (with unsynced writes) */
    uint8_t **sec;       /* sector table: dirty sectors or NULL */
    size_t cap;
    size_t ndirty;
    struct node *next, *prev;
};

enum { H_FILE = 1, H_DIR = 2 };

struct handle {
    int kind;
    int sync;            /* O_SYNC / O_DSYNC: writes go through */
    struct node *n;
    DIR *dir;
};

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static struct node *nodes;      /* every live node (in the map or orphaned) */
static char *backing;
static int tear_mode;
static uint64_t seed;
static int cut;                 /* power lost */

static struct {
    uint64_t writes, write_bytes, sync_writes, fsyncs, sectors_synced;
    uint64_t reads, dirty_peak, dropped, kept, refused, discarded;
} st;

/* ------------------------------------------------------------ helpers */

static uint64_t rng_state;
static uint64_t rng_next(void)
{
    uint64_t z = (rng_state += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

static void logf_(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fflush(stderr);
}

static int bpath(char *out, const char *path)
{
    int n = snprintf(out, PATH_MAX, "%s%s", backing, path);
    return (n < 0 || n >= PATH_MAX) ? -ENAMETOOLONG : 0;
}

#define BPATH(var, path)                      \
    char var[PATH_MAX];                       \
    do {                                      \
        int e_ = bpath(var, path);            \
        if (e_)                               \
            return e_;                        \
    } while (0)

/* Every operation: take the lock; after the cut, refuse with EIO. */
#define ENTER()                               \
    pthread_mutex_lock(&mu);                  \
    if (cut) {                                \
        st.refused++;                         \
        pthread_mutex_unlock(&mu);            \
        return -EIO;                          \
    }
#define LEAVE(r)                              \
    do {                                      \
        int r_ = (r);                         \
        pthread_mutex_unlock(&mu);            \
        return r_;                            \
    } while (0)

static uint64_t total_dirty(void)
{
    uint64_t t = 0;
    for (struct node *n = nodes; n; n = n->next)
        if (n->in_map)
            t += n->ndirty;
    return t;
}

static void drop_sectors_from(struct node *n, size_t first, uint64_t *counter)
{
    for (size_t s = first; s < n->cap; s++)
        if (n->sec[s]) {
            free(n->sec[s]);
            n->sec[s] = NULL;
            n->ndirty--;
            if (counter)
                (*counter)++;
        }
}

static void node_free(struct node *n)
{
    drop_sectors_from(n, 0, NULL);
    free(n->sec);
    close(n->fd);
    if (n->prev)
        n->prev->next = n->next;
    else
        nodes = n->next;
    if (n->next)
        n->next->prev = n->prev;
    free(n);
}

/* Free a node nobody needs: no handle, and no dirty data or no name. */
static void node_maybe_free(struct node *n)
{
    if (n->handles == 0 && (n->ndirty == 0 || !n->in_map))
        node_free(n);
}

static struct node *node_find(dev_t dev, ino_t ino)
{
    for (struct node *n = nodes; n; n = n->next)
        if (n->in_map && n->dev == dev && n->ino == ino)
            return n;
    return NULL;
}

/* The node of an open backing descriptor (takes ownership of fd). */
static struct node *node_for_fd(int fd, int *err)
{
    struct stat sb;
    if (fstat(fd, &sb) < 0) {
        *err = -errno;
        close(fd);
        return NULL;
    }
    struct node *n = node_find(sb.st_dev, sb.st_ino);
    if (n) {
        close(fd);
        return n;
    }
    n = calloc(1, sizeof *n);
    if (!n) {
        *err = -ENOMEM;
        close(fd);
        return NULL;
    }
    n->dev = sb.st_dev;
    n->ino = sb.st_ino;
    n->fd = fd;
    n->in_map = 1;
    n->size = sb.st_size;
    n->next = nodes;
    if (nodes)
        nodes->prev = n;
    nodes = n;
    return n;
}

static struct node *node_for_path(const char *bp)
{
    struct stat sb;
    if (lstat(bp, &sb) < 0)
        return NULL;
    return node_find(sb.st_dev, sb.st_ino);
}

/* After unlink/rename/rmdir: files left with no name lose their data. */
static void reap_unlinked(void)
{
    struct node *n = nodes, *next;
    for (; n; n = next) {
        next = n->next;
        struct stat sb;
        if (n->in_map && fstat(n->fd, &sb) == 0 && sb.st_nlink == 0) {
            n->in_map = 0;
            drop_sectors_from(n, 0, &st.discarded);
            node_maybe_free(n);
        }
    }
}

static off_t backing_size(struct node *n)
{
    struct stat sb;
    return fstat(n->fd, &sb) == 0 ? sb.st_size : 0;
}

static int ensure_cap(struct node *n, size_t need)
{
    if (need <= n->cap)
        return 0;
    size_t cap = n->cap ? n->cap : 1024;
    while (cap < need)
        cap *= 2;
    uint8_t **p = realloc(n->sec, cap * sizeof *p);
    if (!p)
        return -ENOMEM;
    memset(p + n->cap, 0, (cap - n->cap) * sizeof *p);
    n->sec = p;
    n->cap = cap;
    return 0;
}

/* Write sector s of n to the backing file (no further than the logical size). */
static int write_sector(struct node *n, size_t s)
{
    off_t at = (off_t)s * SECTOR;
    off_t len = n->size - at;
    if (len <= 0)
        return 0;
    if (len > SECTOR)
        len = SECTOR;
    ssize_t w = pwrite(n->fd, n->sec[s], len, at);
    return w == len ? 0 : (w < 0 ? -errno : -EIO);
}

/* fsync: every dirty sector of n to the backing file, in runs. */
static int node_sync(struct node *n)
{
    static uint8_t buf[256 * SECTOR];
    size_t s = 0;
    while (s < n->cap) {
        if (!n->sec[s]) {
            s++;
            continue;
        }
        size_t first = s, k = 0;
        while (s < n->cap && n->sec[s] && k < 256) {
            memcpy(buf + k * SECTOR, n->sec[s], SECTOR);
            k++;
            s++;
        }
        off_t at = (off_t)first * SECTOR;
        off_t len = (off_t)k * SECTOR;
        if (at + len > n->size)
            len = n->size - at;
        if (len > 0) {
            ssize_t w = pwrite(n->fd, buf, len, at);
            if (w != len)
                return w < 0 ? -errno : -EIO;
        }
        for (size_t i = first; i < first + k; i++) {
            free(n->sec[i]);
            n->sec[i] = NULL;
            n->ndirty--;
            st.sectors_synced++;
        }
    }
    return 0;
}

/* Truncate the overlay to `size` (the backing file was truncated already). */
static void node_truncate(struct node *n, off_t size)
{
    size_t keep = (size + SECTOR - 1) / SECTOR;
    drop_sectors_from(n, keep, &st.discarded);
    if (size % SECTOR && keep > 0 && keep - 1 < n->cap && n->sec[keep - 1])
        memset(n->sec[keep - 1] + size % SECTOR, 0, SECTOR - size % SECTOR);
    n->size = size;
}

/* The power cut. Called with the lock held. */
static void do_cut(const char *why)
{
    if (cut)
        return;
    cut = 1;
    size_t total = 0;
    for (struct node *n = nodes; n; n = n->next)
        if (n->in_map)
            total += n->ndirty;
    struct pend { struct node *n; size_t s; } *all = NULL;
    size_t k = 0, keep = 0;
    if (tear_mode && total) {
        all = malloc(total * sizeof *all);
        if (all) {
            for (struct node *n = nodes; n; n = n->next)
                if (n->in_map)
                    for (size_t s = 0; s < n->cap; s++)
                        if (n->sec[s]) {
                            all[k].n = n;
                            all[k].s = s;
                            k++;
                        }
            for (size_t i = k; i > 1; i--) {
                size_t j = rng_next() % i;
                struct pend t = all[i - 1];
                all[i - 1] = all[j];
                all[j] = t;
            }
            keep = k / 2 + ((k % 2) ? (rng_next() & 1) : 0);
            for (size_t i = 0; i < keep; i++)
                if (write_sector(all[i].n, all[i].s) == 0)
                    st.kept++;
            free(all);
        }
    }
    for (struct node *n = nodes; n; n = n->next)
        drop_sectors_from(n, 0, NULL);
    st.dropped += total - st.kept;
    logf_("cutfs: cut done (%s) mode=%s seed=%" PRIu64 " dirty=%zu kept=%" PRIu64
          " dropped=%" PRIu64 "\n", why, tear_mode ? "tear" : "drop", seed, total,
          st.kept, st.dropped);
}

static void *cut_thread(void *arg)
{
    sigset_t *set = arg;
    int sig;
    for (;;) {
        if (sigwait(set, &sig) != 0)
            continue;
        if (sig == SIGUSR1) {
            pthread_mutex_lock(&mu);
            do_cut("SIGUSR1");
            pthread_mutex_unlock(&mu);
        }
    }
    return NULL;
}

/* ------------------------------------------------------------ operations */

static void *cf_init(struct fuse_conn_info *conn, struct fuse_config *cfg)
{
    cfg->use_ino = 1;
    cfg->hard_remove = 1;     /* no .fuse_hidden files in BACKING */
    cfg->nullpath_ok = 1;
    cfg->direct_io = 0;
    cfg->kernel_cache = 0;
    conn->want &= ~FUSE_CAP_WRITEBACK_CACHE;   /* write-through */
    return NULL;
}

static void cf_destroy(void *data)
{
    (void)data;
    pthread_mutex_lock(&mu);
    if (!cut)
        do_cut("exit");
    pthread_mutex_unlock(&mu);
}

static int cf_getattr(const char *path, struct stat *sb, struct fuse_file_info *fi)
{
    ENTER();
    struct handle *h = fi ? (struct handle *)(uintptr_t)fi->fh : NULL;
    int r = 0;
    if (h && h->kind == H_FILE) {
        if (fstat(h->n->fd, sb) < 0)
            LEAVE(-errno);
        if (h->n->size > sb->st_size)
            sb->st_size = h->n->size;
        LEAVE(0);
    }
    if (!path)
        LEAVE(-EBADF);
    char bp[PATH_MAX];
    if ((r = bpath(bp, path)))
        LEAVE(r);
    if (lstat(bp, sb) < 0)
        LEAVE(-errno);
    struct node *n = node_find(sb->st_dev, sb->st_ino);
    if (n && n->size > sb->st_size)
        sb->st_size = n->size;
    LEAVE(0);
}

static int cf_access(const char *path, int mask)
{
    ENTER();
    char bp[PATH_MAX];
    int r = bpath(bp, path);
    if (r)
        LEAVE(r);
    LEAVE(access(bp, mask) < 0 ? -errno : 0);
}

static int cf_readlink(const char *path, char *buf, size_t size)
{
    ENTER();
    char bp[PATH_MAX];
    int r = bpath(bp, path);
    if (r)
        LEAVE(r);
    ssize_t k = readlink(bp, buf, size - 1);
    if (k < 0)
        LEAVE(-errno);
    buf[k] = 0;
    LEAVE(0);
}

static int cf_mknod(const char *path, mode_t mode, dev_t rdev)
{
    ENTER();
    char bp[PATH_MAX];
    int r = bpath(bp, path);
    if (r)
        LEAVE(r);
    LEAVE(mknod(bp, mode, rdev) < 0 ? -errno : 0);
}

static int cf_mkdir(const char *path, mode_t mode)
{
    ENTER();
    char bp[PATH_MAX];
    int r = bpath(bp, path);
    if (r)
        LEAVE(r);
    LEAVE(mkdir(bp, mode) < 0 ? -errno : 0);
}

static int cf_unlink(const char *path)
{
    ENTER();
    char bp[PATH_MAX];
    int r = bpath(bp, path);
    if (r)
        LEAVE(r);
    if (unlink(bp) < 0)
        LEAVE(-errno);
    reap_unlinked();
    LEAVE(0);
}

static int cf_rmdir(const char *path)
{
    ENTER();
    char bp[PATH_MAX];
    int r = bpath(bp, path);
    if (r)
        LEAVE(r);
    LEAVE(rmdir(bp) < 0 ? -errno : 0);
}

static int cf_symlink(const char *target, const char *path)
{
    ENTER();
    char bp[PATH_MAX];
    int r = bpath(bp, path);
    if (r)
        LEAVE(r);
    LEAVE(symlink(target, bp) < 0 ? -errno : 0);
}

static int cf_rename(const char *from, const char *to, unsigned int flags)
{
    ENTER();
    char bf[PATH_MAX], bt[PATH_MAX];
    int r = bpath(bf, from);
    if (!r)
        r = bpath(bt, to);
    if (r)
        LEAVE(r);
    if (renameat2(AT_FDCWD, bf, AT_FDCWD, bt, flags) < 0)
        LEAVE(-errno);
    reap_unlinked();
    LEAVE(0);
}

static int cf_link(const char *from, const char *to)
{
    ENTER();
    char bf[PATH_MAX], bt[PATH_MAX];
    int r = bpath(bf, from);
    if (!r)
        r = bpath(bt, to);
    if (r)
        LEAVE(r);
    LEAVE(link(bf, bt) < 0 ? -errno : 0);
}

static int cf_chmod(const char *path, mode_t mode, struct fuse_file_info *fi)
{
    ENTER();
    struct handle *h = fi ? (struct handle *)(uintptr_t)fi->fh : NULL;
    if (h && h->kind == H_FILE)
        LEAVE(fchmod(h->n->fd, mode) < 0 ? -errno : 0);
    if (!path)
        LEAVE(-EBADF);
    char bp[PATH_MAX];
    int r = bpath(bp, path);
    if (r)
        LEAVE(r);
    LEAVE(chmod(bp, mode) < 0 ? -errno : 0);
}

static int cf_chown(const char *path, uid_t uid, gid_t gid, struct fuse_file_info *fi)
{
    ENTER();
    struct handle *h = fi ? (struct handle *)(uintptr_t)fi->fh : NULL;
    if (h && h->kind == H_FILE)
        LEAVE(fchown(h->n->fd, uid, gid) < 0 ? -errno : 0);
    if (!path)
        LEAVE(-EBADF);
    char bp[PATH_MAX];
    int r = bpath(bp, path);
    if (r)
        LEAVE(r);
    LEAVE(lchown(bp, uid, gid) < 0 ? -errno : 0);
}

static int cf_truncate(const char *path, off_t size, struct fuse_file_info *fi)
{
    ENTER();
    struct handle *h = fi ? (struct handle *)(uintptr_t)fi->fh : NULL;
    struct node *n = NULL;
    if (h && h->kind == H_FILE) {
        n = h->n;
        if (ftruncate(n->fd, size) < 0)
            LEAVE(-errno);
    } else {
        if (!path)
            LEAVE(-EBADF);
        char bp[PATH_MAX];
        int r = bpath(bp, path);
        if (r)
            LEAVE(r);
        if (truncate(bp, size) < 0)
            LEAVE(-errno);
        n = node_for_path(bp);
    }
    if (n)
        node_truncate(n, size);
    LEAVE(0);
}

static int cf_utimens(const char *path, const struct timespec tv[2], struct fuse_file_info *fi)
{
    ENTER();
    struct handle *h = fi ? (struct handle *)(uintptr_t)fi->fh : NULL;
    if (h && h->kind == H_FILE)
        LEAVE(futimens(h->n->fd, tv) < 0 ? -errno : 0);
    if (!path)
        LEAVE(-EBADF);
    char bp[PATH_MAX];
    int r = bpath(bp, path);
    if (r)
        LEAVE(r);
    LEAVE(utimensat(AT_FDCWD, bp, tv, AT_SYMLINK_NOFOLLOW) < 0 ? -errno : 0);
}

/* open/create: the backing file is opened O_RDWR once per node; the flags
 * that change the file (O_CREAT, O_EXCL, O_TRUNC) apply at once. */
static int open_common(const char *path, int flags, mode_t mode, int creating,
                       struct fuse_file_info *fi)
{
    char bp[PATH_MAX];
    int r = bpath(bp, path);
    if (r)
        return r;
    int oflags = O_RDWR | O_CLOEXEC | (flags & (O_EXCL | O_TRUNC | O_NOFOLLOW));
    if (creating)
        oflags |= O_CREAT;
    int fd = open(bp, oflags, mode);
    if (fd < 0 && errno == EISDIR)
        return -EISDIR;
    if (fd < 0 && (errno == EACCES || errno == EPERM) && (flags & O_ACCMODE) == O_RDONLY)
        fd = open(bp, O_RDONLY | O_CLOEXEC);   /* read-only file, read-only use */
    if (fd < 0)
        return -errno;
    struct node *n = node_for_fd(fd, &r);
    if (!n)
        return r;
    if (flags & O_TRUNC) {
        drop_sectors_from(n, 0, &st.discarded);
        n->size = backing_size(n);
    }
    struct handle *h = calloc(1, sizeof *h);
    if (!h) {
        node_maybe_free(n);
        return -ENOMEM;
    }
    h->kind = H_FILE;
    h->n = n;
    h->sync = (flags & O_DSYNC) != 0;   /* O_SYNC includes O_DSYNC */
    n->handles++;
    fi->fh = (uintptr_t)h;
    fi->direct_io = 0;
    fi->keep_cache = 0;
    return 0;
}

static int cf_open(const char *path, struct fuse_file_info *fi)
{
    ENTER();
    LEAVE(open_common(path, fi->flags, 0, 0, fi));
}

static int cf_create(const char *path, mode_t mode, struct fuse_file_info *fi)
{
    ENTER();
    LEAVE(open_common(path, fi->flags, mode, 1, fi));
}

static int cf_read(const char *path, char *buf, size_t size, off_t off,
                   struct fuse_file_info *fi)
{
    (void)path;
    ENTER();
    struct handle *h = (struct handle *)(uintptr_t)fi->fh;
    struct node *n = h->n;
    st.reads++;
    off_t end = n->size;
    if (off >= end)
        LEAVE(0);
    if ((off_t)size > end - off)
        size = end - off;
    size_t got = 0;
    while (got < size) {
        ssize_t k = pread(n->fd, buf + got, size - got, off + got);
        if (k < 0)
            LEAVE(-errno);
        if (k == 0)
            break;
        got += k;
    }
    if (got < size)
        memset(buf + got, 0, size - got);   /* written but not synced past EOF */
    size_t s0 = off / SECTOR, s1 = (off + size - 1) / SECTOR;
    for (size_t s = s0; s <= s1 && s < n->cap; s++) {
        if (!n->sec[s])
            continue;
        off_t ss = (off_t)s * SECTOR;
        off_t a = ss > off ? ss : off;
        off_t b = ss + SECTOR < off + (off_t)size ? ss + SECTOR : off + (off_t)size;
        memcpy(buf + (a - off), n->sec[s] + (a - ss), b - a);
    }
    LEAVE((int)size);
}

static int cf_write(const char *path, const char *buf, size_t size, off_t off,
                    struct fuse_file_info *fi)
{
    (void)path;
    ENTER();
    struct handle *h = (struct handle *)(uintptr_t)fi->fh;
    struct node *n = h->n;
    st.writes++;
    st.write_bytes += size;
    if (size == 0)
        LEAVE(0);
    size_t s0 = off / SECTOR, s1 = (off + size - 1) / SECTOR;
    if (h->sync) {
        /* Written through; the overlay keeps the other bytes of its sectors. */
        st.sync_writes++;
        size_t done = 0;
        while (done < size) {
            ssize_t k = pwrite(n->fd, buf + done, size - done, off + done);
            if (k < 0)
                LEAVE(-errno);
            done += k;
        }
        for (size_t s = s0; s <= s1 && s < n->cap; s++) {
            if (!n->sec[s])
                continue;
            off_t ss = (off_t)s * SECTOR;
            off_t a = ss > off ? ss : off;
            off_t b = ss + SECTOR < off + (off_t)size ? ss + SECTOR : off + (off_t)size;
            memcpy(n->sec[s] + (a - ss), buf + (a - off), b - a);
        }
        if (off + (off_t)size > n->size)
            n->size = off + size;
        LEAVE((int)size);
    }
    int r = ensure_cap(n, s1 + 1);
    if (r)
        LEAVE(r);
    for (size_t s = s0; s <= s1; s++) {
        off_t ss = (off_t)s * SECTOR;
        off_t a = ss > off ? ss : off;
        off_t b = ss + SECTOR < off + (off_t)size ? ss + SECTOR : off + (off_t)size;
        if (!n->sec[s]) {
            uint8_t *p = malloc(SECTOR);
            if (!p)
                LEAVE(-ENOMEM);
            if (a != ss || b != ss + SECTOR) {
                /* A partial sector starts from the file's current content. */
                ssize_t k = pread(n->fd, p, SECTOR, ss);
                if (k < 0)
                    k = 0;
                memset(p + k, 0, SECTOR - k);
            }
            n->sec[s] = p;
            n->ndirty++;
        }
        memcpy(n->sec[s] + (a - ss), buf + (a - off), b - a);
    }
    if (off + (off_t)size > n->size)
        n->size = off + size;
    uint64_t d = total_dirty();
    if (d > st.dirty_peak)
        st.dirty_peak = d;
    LEAVE((int)size);
}

static int cf_statfs(const char *path, struct statvfs *sv)
{
    (void)path;
    ENTER();
    LEAVE(statvfs(backing, sv) < 0 ? -errno : 0);
}

static int cf_flush(const char *path, struct fuse_file_info *fi)
{
    (void)path;
    (void)fi;
    return 0;   /* close is not a sync */
}

static int cf_release(const char *path, struct fuse_file_info *fi)
{
    (void)path;
    pthread_mutex_lock(&mu);
    struct handle *h = (struct handle *)(uintptr_t)fi->fh;
    if (h) {
        h->n->handles--;
        if (!cut)
            node_maybe_free(h->n);
        free(h);
    }
    pthread_mutex_unlock(&mu);
    return 0;
}

static int cf_fsync(const char *path, int datasync, struct fuse_file_info *fi)
{
    (void)path;
    (void)datasync;
    ENTER();
    struct handle *h = (struct handle *)(uintptr_t)fi->fh;
    st.fsyncs++;
    int r = node_sync(h->n);
    LEAVE(r);
}

static int cf_opendir(const char *path, struct fuse_file_info *fi)
{
    ENTER();
    char bp[PATH_MAX];
    int r = bpath(bp, path);
    if (r)
        LEAVE(r);
    DIR *d = opendir(bp);
    if (!d)
        LEAVE(-errno);
    struct handle *h = calloc(1, sizeof *h);
    if (!h) {
        closedir(d);
        LEAVE(-ENOMEM);
    }
    h->kind = H_DIR;
    h->dir = d;
    fi->fh = (uintptr_t)h;
    LEAVE(0);
}

static int cf_readdir(const char *path, void *buf, fuse_fill_dir_t filler, off_t off,
                      struct fuse_file_info *fi, enum fuse_readdir_flags flags)
{
    (void)path;
    (void)off;
    (void)flags;
    ENTER();
    struct handle *h = (struct handle *)(uintptr_t)fi->fh;
    rewinddir(h->dir);
    struct dirent *de;
    errno = 0;
    while ((de = readdir(h->dir)) != NULL) {
        struct stat sb;
        memset(&sb, 0, sizeof sb);
        sb.st_ino = de->d_ino;
        sb.st_mode = de->d_type << 12;
        if (filler(buf, de->d_name, &sb, 0, 0))
            break;
    }
    LEAVE(0);
}

static int cf_releasedir(const char *path, struct fuse_file_info *fi)
{
    (void)path;
    pthread_mutex_lock(&mu);
    struct handle *h = (struct handle *)(uintptr_t)fi->fh;
    if (h) {
        closedir(h->dir);
        free(h);
    }
    pthread_mutex_unlock(&mu);
    return 0;
}

static int cf_fsyncdir(const char *path, int datasync, struct fuse_file_info *fi)
{
    (void)path;
    (void)datasync;
    (void)fi;
    ENTER();
    LEAVE(0);   /* metadata is durable as soon as it is done */
}

static int cf_fallocate(const char *path, int mode, off_t off, off_t len,
                        struct fuse_file_info *fi)
{
    (void)path;
    (void)mode;
    (void)off;
    (void)len;
    (void)fi;
    ENTER();
    LEAVE(-EOPNOTSUPP);
}

static const struct fuse_operations ops = {
    .init = cf_init,
    .destroy = cf_destroy,
    .getattr = cf_getattr,
    .access = cf_access,
    .readlink = cf_readlink,
    .mknod = cf_mknod,
    .mkdir = cf_mkdir,
    .unlink = cf_unlink,
    .rmdir = cf_rmdir,
    .symlink = cf_symlink,
    .rename = cf_rename,
    .link = cf_link,
    .chmod = cf_chmod,
    .chown = cf_chown,
    .truncate = cf_truncate,
    .utimens = cf_utimens,
    .open = cf_open,
    .create = cf_create,
    .read = cf_read,
    .write = cf_write,
    .statfs = cf_statfs,
    .flush = cf_flush,
    .release = cf_release,
    .fsync = cf_fsync,
    .opendir = cf_opendir,
    .readdir = cf_readdir,
    .releasedir = cf_releasedir,
    .fsyncdir = cf_fsyncdir,
    .fallocate = cf_fallocate,
};

static void usage(void)
{
    fprintf(stderr, "usage: cutfs BACKING MOUNTPOINT [--mode drop|tear] [--seed N] [-o opt,...]\n"
                    "SIGUSR1 cuts the power; then every operation fails with EIO.\n");
    exit(2);
}

int main(int argc, char **argv)
{
    char *pos[2] = {NULL, NULL};
    int npos = 0;
    char *fargv[64];
    int fargc = 0;
    fargv[fargc++] = argv[0];
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--mode") && i + 1 < argc) {
            const char *m = argv[++i];
            if (!strcmp(m, "tear"))
                tear_mode = 1;
            else if (!strcmp(m, "drop"))
                tear_mode = 0;
            else
                usage();
        } else if (!strcmp(argv[i], "--seed") && i + 1 < argc) {
            seed = strtoull(argv[++i], NULL, 0);
        } else if (!strcmp(argv[i], "-o") && i + 1 < argc && fargc < 60) {
            fargv[fargc++] = argv[i];
            fargv[fargc++] = argv[++i];
        } else if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            usage();
        } else if (argv[i][0] != '-' && npos < 2) {
            pos[npos++] = argv[i];
        } else {
            usage();
        }
    }
    if (npos != 2)
        usage();
    backing = realpath(pos[0], NULL);
    if (!backing) {
        perror(pos[0]);
        return 1;
    }
    rng_state = seed;
    fargv[fargc++] = "-f";
    fargv[fargc++] = "-o";
    fargv[fargc++] = "fsname=cutfs,subtype=cutfs,max_threads=16,max_idle_threads=16";
    fargv[fargc++] = pos[1];
    fargv[fargc] = NULL;

    /* SIGUSR1 is taken by one thread with sigwait; every other thread
     * (FUSE's workers inherit this mask) has it blocked. */
    static sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGUSR1);
    pthread_sigmask(SIG_BLOCK, &set, NULL);
    /* The cut thread takes no other signal: SIGTERM/SIGINT must reach the
     * main thread, where fuse_main waits, to end the loop. */
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, &old);
    pthread_t t;
    if (pthread_create(&t, NULL, cut_thread, &set) != 0) {
        perror("pthread_create");
        return 1;
    }
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    pthread_detach(t);

    logf_("cutfs: %s on %s mode=%s seed=%" PRIu64 "\n", backing, pos[1],
          tear_mode ? "tear" : "drop", seed);
    int rc = fuse_main(fargc, fargv, &ops, NULL);
    pthread_mutex_lock(&mu);
    if (!cut)
        do_cut("exit");   /* never reached normally: destroy cuts */
    logf_("cutfs: stats writes=%" PRIu64 " write_bytes=%" PRIu64 " sync_writes=%" PRIu64
          " fsyncs=%" PRIu64 " sectors_synced=%" PRIu64 " reads=%" PRIu64
          " dirty_peak=%" PRIu64 " cut_dropped=%" PRIu64 " cut_kept=%" PRIu64
          " discarded=%" PRIu64 " refused_after_cut=%" PRIu64 "\n",
          st.writes, st.write_bytes, st.sync_writes, st.fsyncs, st.sectors_synced,
          st.reads, st.dirty_peak, st.dropped, st.kept, st.discarded, st.refused);
    /* Nothing more may reach BACKING: leave without flushing anything. */
    _exit(rc);
}
