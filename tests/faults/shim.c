/* LD_PRELOAD fault shim for the storage tests: makes pread()/pread64() of one file fail.
 *
 * Built by tests/faults (the system C compiler) and preloaded into a child Python
 * process.  Faults are configured at run time through engram_fault_set(), which the
 * child calls with ctypes (the preloaded library is the one ctypes finds by path):
 *
 *   mode    1 EIO (-1, errno EIO), 2 EINTR (-1, errno EINTR), 3 short (fewer bytes
 *           than asked: half the request, a multiple of `granule`; requests of at
 *           most `granule` bytes are left alone), 4 end of file (0 bytes), 0 off
 *   suffix  only descriptors whose /proc/self/fd link ends with it
 *   lo, hi  only reads overlapping file bytes [lo, hi)
 *   every   fire on every `every`-th matching read (1 = all of them)
 *   limit   stop after this many faults (-1 = never)
 *
 * preadv() and preadv2() with their 64-bit names (Python's os.preadv) get the same faults
 * except short reads.
 * engram_fault_fired() and engram_fault_matched() count what happened since the last
 * engram_fault_set().  io_uring reads bypass libc, so they never come through here.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
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

/* Faults for the vector reads; returns 1 and sets *ret when one fires. */
static int preadv_fault(int fd, const struct iovec *iov, int n, off_t off, ssize_t *ret) {
    size_t count = 0;
    for (int i = 0; i < n; i++) count += iov[i].iov_len;
    int mode = atomic_load(&fault_mode);
    if (!mode || mode == 3 || count == 0 || (unsigned long long)off + count <= fault_lo ||
        (unsigned long long)off >= fault_hi || !fd_matches(fd))
        return 0;
    long k = atomic_fetch_add(&fault_matched, 1) + 1;
    if (k % fault_every != 0) return 0;
    if (fault_limit >= 0 && atomic_fetch_add(&fault_fired, 1) >= fault_limit) {
        atomic_fetch_sub(&fault_fired, 1);
        return 0;
    }
    if (fault_limit < 0) atomic_fetch_add(&fault_fired, 1);
    if (mode == 4) {
        *ret = 0;
    } else {
        errno = mode == 1 ? EIO : EINTR;
        *ret = -1;
    }
    return 1;
}

#define ENGRAM_PREADV(name)                                                              \
    ssize_t name(int fd, const struct iovec *iov, int n, off_t off) {                    \
        static preadv_fn real;                                                           \
        ssize_t ret;                                                                     \
        if (!real) real = (preadv_fn)dlsym(RTLD_NEXT, #name);                            \
        return preadv_fault(fd, iov, n, off, &ret) ? ret : real(fd, iov, n, off);       \
    }
#define ENGRAM_PREADV2(name)                                                             \
    ssize_t name(int fd, const struct iovec *iov, int n, off_t off, int flags) {         \
        static preadv2_fn real;                                                          \
        ssize_t ret;                                                                     \
        if (!real) real = (preadv2_fn)dlsym(RTLD_NEXT, #name);                           \
        return preadv_fault(fd, iov, n, off, &ret) ? ret : real(fd, iov, n, off, flags); \
    }
ENGRAM_PREADV(preadv)
ENGRAM_PREADV(preadv64)
ENGRAM_PREADV2(preadv2)
ENGRAM_PREADV2(preadv64v2)
