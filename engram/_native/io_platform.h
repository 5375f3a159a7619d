/* Platform layer of the row readers (SPEC §8): every call that exists on some
 * systems only is behind a guard here, so the extension builds on Linux, the
 * BSDs and macOS alike.
 *
 *   posix_fadvise   Linux and the BSDs; macOS has none (its uncached path is
 *                   F_NOCACHE + F_RDAHEAD 0, set by engram/table.py at open).
 *   preadv2 with    Linux; RWF_DONTCACHE (buffered reads whose pages the
 *   RWF_DONTCACHE   kernel drops once copied) from Linux 6.14, refused with
 *                   EOPNOTSUPP by older kernels and by file systems without
 *                   support; the caller probes it once per descriptor.
 *   io_uring        Linux only: see io_ring.h.
 *   O_DIRECT        opened by engram/table.py, never here.
 */
#ifndef ENGRAM_IO_PLATFORM_H
#define ENGRAM_IO_PLATFORM_H

#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <unistd.h>

#if defined(POSIX_FADV_DONTNEED)
#define ENGRAM_HAVE_FADVISE 1
#else
#define ENGRAM_HAVE_FADVISE 0
#endif

#if defined(__linux__)
#define ENGRAM_HAVE_PREADV2 1
/* uapi value (include/uapi/linux/fs.h, Linux 6.14); older C libraries lack the name. */
#ifndef RWF_DONTCACHE
#define RWF_DONTCACHE 0x00000080
#endif
#else
#define ENGRAM_HAVE_PREADV2 0
#define RWF_DONTCACHE 0
#endif

/* Bytes of a page, read once. */
static uint64_t engram_page_bytes(void) {
    static uint64_t page;
    if (!page) {
        long p = sysconf(_SC_PAGESIZE);
        page = p > 0 ? (uint64_t)p : 4096;
    }
    return page;
}

/* Buffered fallback: drop the cached pages of [off, off + len), widened to
 * whole `granule`s (a power of two >= the page: the unit the file system
 * fills the cache in, e.g. a squashfs block) plus the unit after them (a read
 * in the last page of a squashfs block also pulls in the next block: its
 * readahead rounds a block-sized request up to two).  No-op where the platform
 * has no posix_fadvise (macOS: F_NOCACHE keeps the pages out in the first place). */
static void engram_drop_range(int fd, uint64_t off, uint64_t len, uint64_t granule) {
#if ENGRAM_HAVE_FADVISE
    uint64_t g = granule > engram_page_bytes() ? granule : engram_page_bytes();
    uint64_t start = off / g * g, end = (off + len + g - 1) / g * g + g;
    posix_fadvise(fd, (off_t)start, (off_t)(end - start), POSIX_FADV_DONTNEED);
#else
    (void)fd; (void)off; (void)len; (void)granule;
#endif
}

/* pread, or preadv2 with `rw_flags` (RWF_DONTCACHE) where the caller probed
 * that the descriptor takes them. */
static ssize_t engram_pread(int fd, void *buf, size_t len, uint64_t off, int rw_flags) {
#if ENGRAM_HAVE_PREADV2
    if (rw_flags) {
        struct iovec v = {buf, len};
        return preadv2(fd, &v, 1, (off_t)off, rw_flags);
    }
#else
    (void)rw_flags;
#endif
    return pread(fd, buf, len, (off_t)off);
}

#endif
