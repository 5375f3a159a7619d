/* LD_PRELOAD fault shim for the storage tests: makes pread()/pread64() of one file fail,
 * and io_uring reads of it complete with -EINVAL.
 *
 * Built by tests/faults (the system C compiler) and preloaded into a child Python
 * process.  Faults are configured at run time through engram_fault_set(), which the
 * child calls with ctypes (the preloaded library is the one ctypes finds by path):
 *
 *   mode    1 EIO (-1, errno EIO), 2 EINTR (-1, errno EINTR), 3 short (fewer bytes
 *           than asked: half the request, a multiple of `granule`; requests of at
 *           most `granule` bytes are left alone), 4 end of file (0 bytes),
 *           5 io_uring reads complete with -EINVAL (see below), 0 off
 *   suffix  only descriptors whose /proc/self/fd link ends with it
 *   lo, hi  only reads overlapping file bytes [lo, hi)
 *   every   fire on every `every`-th matching read (1 = all of them)
 *   limit   stop after this many faults (-1 = never)
 *
 * preadv() and preadv2() with their 64-bit names (Python's os.preadv, and the engine's
 * buffered reads with RWF_DONTCACHE) get the same faults.
 *
 * io_uring (mode 5): the engine issues io_uring_enter through libc's syscall(), so this
 * shim wraps syscall() and mmap(): it remembers the SQE array of every ring (the mmap at
 * IORING_OFF_SQES of an io_uring descriptor) and, before each io_uring_enter that submits,
 * rewrites the opcode of every SQE reading a matching descriptor to an invalid one.  The
 * ring starts and io_uring_enter succeeds, but those reads complete with -EINVAL: what a
 * kernel or seccomp filter that lets the ring start but not read does.  `lo`/`hi` and
 * `granule` do not apply; `every` counts matching SQEs.
 *
 * engram_fault_fired() and engram_fault_matched() count what happened since the last
 * engram_fault_set().
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <unistd.h>

typedef ssize_t (*pread_fn)(int, void *, size_t, off_t);

static atomic_int fault_mode;
static char fault_suffix[512];
static unsigned long long fault_lo, fault_hi;
static long fault_every = 1, fault_limit = -1;
static size_t fault_granule = 1;
static atomic_long fault_matched, fault_fired;

int engram_fault_set(int mode, const char *suffix, unsigned long long lo, unsigned long long hi, long every,
                     long limit, long granule) {
    atomic_store(&fault_mode, 0);
    snprintf(fault_suffix, sizeof fault_suffix, "%s", suffix ? suffix : "");
    fault_lo = lo;
    fault_hi = hi;
    fault_every = every > 0 ? every : 1;
    fault_limit = limit;
    fault_granule = granule > 0 ? (size_t)granule : 1;
    atomic_store(&fault_matched, 0);
    atomic_store(&fault_fired, 0);
    atomic_store(&fault_mode, mode);
    return 0;
}

long engram_fault_fired(void) { return atomic_load(&fault_fired); }
long engram_fault_matched(void) { return atomic_load(&fault_matched); }

static int fd_matches(int fd) {
    char link[64], target[4096];
    snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    ssize_t n = readlink(link, target, sizeof target - 1);
    if (n < 0) return 0;
    target[n] = 0;
    size_t ls = strlen(fault_suffix);
    return (size_t)n >= ls && memcmp(target + n - ls, fault_suffix, ls) == 0;
}

static ssize_t faulty_pread(pread_fn real, int fd, void *buf, size_t count, off_t off) {
    int mode = atomic_load(&fault_mode);
    if (!mode || count == 0 || (unsigned long long)off + count <= fault_lo ||
        (unsigned long long)off >= fault_hi || !fd_matches(fd))
        return real(fd, buf, count, off);
    if (mode == 3 && count <= fault_granule) return real(fd, buf, count, off);
    long k = atomic_fetch_add(&fault_matched, 1) + 1;
    if (k % fault_every != 0) return real(fd, buf, count, off);
    if (fault_limit >= 0 && atomic_fetch_add(&fault_fired, 1) >= fault_limit) {
        atomic_fetch_sub(&fault_fired, 1);
        return real(fd, buf, count, off);
    }
    if (fault_limit < 0) atomic_fetch_add(&fault_fired, 1);
    switch (mode) {
    case 1: errno = EIO; return -1;
    case 2: errno = EINTR; return -1;
    case 3: {
        size_t n = count / 2 / fault_granule * fault_granule;
        return real(fd, buf, n ? n : fault_granule, off);
    }
    case 4: return 0;
    default: return real(fd, buf, count, off);
    }
}

ssize_t pread(int fd, void *buf, size_t count, off_t off) {
    static pread_fn real;
    if (!real) real = (pread_fn)dlsym(RTLD_NEXT, "pread");
    return faulty_pread(real, fd, buf, count, off);
}

ssize_t pread64(int fd, void *buf, size_t count, off_t off) {
    static pread_fn real;
    if (!real) real = (pread_fn)dlsym(RTLD_NEXT, "pread64");
    return faulty_pread(real, fd, buf, count, off);
}

typedef ssize_t (*preadv_fn)(int, const struct iovec *, int, off_t);
typedef ssize_t (*preadv2_fn)(int, const struct iovec *, int, off_t, int);

/* Faults for the vector reads: 0 none, 1 fired (*ret is the result), 2 short (read only
 * the first *short_len bytes). */
static int preadv_fault(int fd, const struct iovec *iov, int n, off_t off, ssize_t *ret, size_t *short_len) {
    size_t count = 0;
    for (int i = 0; i < n; i++) count += iov[i].iov_len;
    int mode = atomic_load(&fault_mode);
    if (!mode || mode == 5 || count == 0 || (unsigned long long)off + count <= fault_lo ||
        (unsigned long long)off >= fault_hi || !fd_matches(fd))
        return 0;
    if (mode == 3 && count <= fault_granule) return 0;
    long k = atomic_fetch_add(&fault_matched, 1) + 1;
    if (k % fault_every != 0) return 0;
    if (fault_limit >= 0 && atomic_fetch_add(&fault_fired, 1) >= fault_limit) {
        atomic_fetch_sub(&fault_fired, 1);
        return 0;
    }
    if (fault_limit < 0) atomic_fetch_add(&fault_fired, 1);
    if (mode == 3) {
        size_t m = count / 2 / fault_granule * fault_granule;
        *short_len = m ? m : fault_granule;
        return 2;
    }
    if (mode == 4) {
        *ret = 0;
    } else {
        errno = mode == 1 ? EIO : EINTR;
        *ret = -1;
    }
    return 1;
}

/* iov cut to its first `len` bytes (into `out`, at most 16 entries); returns the entry count. */
static int cut_iov(const struct iovec *iov, int n, size_t len, struct iovec *out) {
    int k = 0;
    for (int i = 0; i < n && len > 0 && k < 16; i++, k++) {
        out[k] = iov[i];
        if (out[k].iov_len > len) out[k].iov_len = len;
        len -= out[k].iov_len;
    }
    return k;
}

#define ENGRAM_PREADV(name)                                                              \
    ssize_t name(int fd, const struct iovec *iov, int n, off_t off) {                    \
        static preadv_fn real;                                                           \
        ssize_t ret;                                                                     \
        size_t len;                                                                      \
        struct iovec cut[16];                                                            \
        if (!real) real = (preadv_fn)dlsym(RTLD_NEXT, #name);                            \
        switch (preadv_fault(fd, iov, n, off, &ret, &len)) {                             \
        case 1: return ret;                                                              \
        case 2: return real(fd, cut, cut_iov(iov, n, len, cut), off);                    \
        default: return real(fd, iov, n, off);                                           \
        }                                                                                \
    }
#define ENGRAM_PREADV2(name)                                                             \
    ssize_t name(int fd, const struct iovec *iov, int n, off_t off, int flags) {         \
        static preadv2_fn real;                                                          \
        ssize_t ret;                                                                     \
        size_t len;                                                                      \
        struct iovec cut[16];                                                            \
        if (!real) real = (preadv2_fn)dlsym(RTLD_NEXT, #name);                           \
        switch (preadv_fault(fd, iov, n, off, &ret, &len)) {                             \
        case 1: return ret;                                                              \
        case 2: return real(fd, cut, cut_iov(iov, n, len, cut), off, flags);             \
        default: return real(fd, iov, n, off, flags);                                    \
        }                                                                                \
    }
ENGRAM_PREADV(preadv)
ENGRAM_PREADV(preadv64)
ENGRAM_PREADV2(preadv2)
ENGRAM_PREADV2(preadv64v2)

/* ------------------------------------------------------------------ io_uring */
#if defined(__linux__) && defined(__NR_io_uring_enter) && defined(__NR_io_uring_setup)
#include <linux/io_uring.h>
#define MAX_RINGS 64

/* What the shim knows of each ring: its descriptor, SQ ring offsets, and the two mappings. */
static struct ring {
    int fd;
    struct io_sqring_offsets sq_off;
    uint8_t *sq;                      /* mmap at IORING_OFF_SQ_RING */
    struct io_uring_sqe *sqes;        /* mmap at IORING_OFF_SQES */
} rings[MAX_RINGS];
static pthread_mutex_t rings_mu = PTHREAD_MUTEX_INITIALIZER;

static struct ring *ring_of(int fd) {
    for (int i = 0; i < MAX_RINGS; i++)
        if (rings[i].fd == fd && (rings[i].sq || rings[i].sqes || rings[i].sq_off.array)) return &rings[i];
    return NULL;
}

typedef void *(*mmap_fn)(void *, size_t, int, int, int, off_t);

static void *shim_mmap(mmap_fn real, void *addr, size_t len, int prot, int flags, int fd, off_t off) {
    void *p = real(addr, len, prot, flags, fd, off);
    if (p == MAP_FAILED || fd < 0) return p;
    pthread_mutex_lock(&rings_mu);
    struct ring *r = ring_of(fd);
    if (r && (unsigned long long)off == IORING_OFF_SQ_RING) r->sq = (uint8_t *)p;
    if (r && (unsigned long long)off == IORING_OFF_SQES) r->sqes = (struct io_uring_sqe *)p;
    pthread_mutex_unlock(&rings_mu);
    return p;
}

void *mmap(void *addr, size_t len, int prot, int flags, int fd, off_t off) {
    static mmap_fn real;
    if (!real) real = (mmap_fn)dlsym(RTLD_NEXT, "mmap");
    return shim_mmap(real, addr, len, prot, flags, fd, off);
}

void *mmap64(void *addr, size_t len, int prot, int flags, int fd, off_t off) {
    static mmap_fn real;
    if (!real) real = (mmap_fn)dlsym(RTLD_NEXT, "mmap64");
    return shim_mmap(real, addr, len, prot, flags, fd, off);
}

int close(int fd) {
    static int (*real)(int);
    if (!real) real = (int (*)(int))dlsym(RTLD_NEXT, "close");
    pthread_mutex_lock(&rings_mu);
    struct ring *r = ring_of(fd);
    if (r) memset(r, 0, sizeof(*r));
    pthread_mutex_unlock(&rings_mu);
    return real(fd);
}

/* Before an io_uring_enter of ring `fd`: every SQE it is about to submit that reads a
 * matching file gets an opcode no kernel knows (it then completes with -EINVAL). */
static void poison_pending(int fd) {
    pthread_mutex_lock(&rings_mu);
    struct ring *r = ring_of(fd);
    if (r && r->sq && r->sqes) {
        unsigned head = __atomic_load_n((unsigned *)(r->sq + r->sq_off.head), __ATOMIC_ACQUIRE);
        unsigned tail = __atomic_load_n((unsigned *)(r->sq + r->sq_off.tail), __ATOMIC_ACQUIRE);
        unsigned mask = *(unsigned *)(r->sq + r->sq_off.ring_mask);
        unsigned *array = (unsigned *)(r->sq + r->sq_off.array);
        for (unsigned i = head; i != tail; i++) {
            struct io_uring_sqe *sqe = &r->sqes[array[i & mask]];
            if (sqe->opcode != IORING_OP_READ || !fd_matches(sqe->fd)) continue;
            long k = atomic_fetch_add(&fault_matched, 1) + 1;
            if (k % fault_every != 0) continue;
            if (fault_limit >= 0 && atomic_load(&fault_fired) >= fault_limit) continue;
            atomic_fetch_add(&fault_fired, 1);
            sqe->opcode = 0xff;
        }
    }
    pthread_mutex_unlock(&rings_mu);
}

long syscall(long number, ...) {
    static long (*real)(long, ...);
    if (!real) real = (long (*)(long, ...))dlsym(RTLD_NEXT, "syscall");
    va_list ap;
    va_start(ap, number);
    long a[6];
    for (int i = 0; i < 6; i++) a[i] = va_arg(ap, long);
    va_end(ap);
    if (number == __NR_io_uring_enter && atomic_load(&fault_mode) == 5 && a[1] > 0)
        poison_pending((int)a[0]);
    long rc = real(number, a[0], a[1], a[2], a[3], a[4], a[5]);
    if (number == __NR_io_uring_setup && rc >= 0) {
        const struct io_uring_params *p = (const struct io_uring_params *)a[1];
        pthread_mutex_lock(&rings_mu);
        for (int i = 0; i < MAX_RINGS; i++)
            if (!rings[i].sq_off.array && !rings[i].sq && !rings[i].sqes) {
                rings[i].fd = (int)rc;
                rings[i].sq_off = p->sq_off;
                break;
            }
        pthread_mutex_unlock(&rings_mu);
    }
    return rc;
}
#endif
