// What HAProxy holds, by allocation: an LD_PRELOAD tracer of every live malloc, calloc,
// realloc and aligned allocation, by size and by the first caller inside the traced
// program (its offset in the binary), used for docs/BENCHMARKS.md, "What HAProxy 2.6
// holds per backend and per server".
//
//   gcc -O2 -shared -fPIC -o /tmp/alloc-trace.so scripts/haproxy-alloc-trace.c -lpthread
//   ALLOC_TRACE_OUT=/tmp/a.txt LD_PRELOAD=/tmp/alloc-trace.so haproxy -db -f haproxy.cfg &
//   # once HAProxy answers on its stats socket:
//   touch /tmp/a.txt.go       # the live allocations are written to /tmp/a.txt
//
// Each line of the dump is "SIZE CALLER" (CALLER in hex, 0xffffffff when no frame is in
// the program). Compare two dumps (e.g. 1,000 backends against none) by (size, caller)
// counts; name the callers with `addr2line -f -e haproxy` on a build with symbols, or
// with `objdump -d` and the exported names of Debian's stripped binary.
#define _GNU_SOURCE
#include <stdlib.h>
#include <stdint.h>
#include <string.h>
#include <unistd.h>
#include <fcntl.h>
#include <stdio.h>
#include <pthread.h>
#include <execinfo.h>
#include <link.h>
#include <sys/stat.h>

extern void *__libc_malloc(size_t);
extern void *__libc_calloc(size_t, size_t);
extern void *__libc_realloc(void *, size_t);
extern void __libc_free(void *);
extern void *__libc_memalign(size_t, size_t);

#define CAP (1u << 23)
struct ent { uintptr_t p; uint32_t size; uint32_t caller; };
static struct ent *tab;
static volatile int lk;
static uintptr_t lo, hi;
static __thread int inside;

static void lock(void) { while (__sync_lock_test_and_set(&lk, 1)) ; }
static void unlock(void) { __sync_lock_release(&lk); }
static inline uint32_t h(uintptr_t p) { return (uint32_t)((p >> 4) * 2654435761u) & (CAP - 1); }

static int phdr_cb(struct dl_phdr_info *info, size_t size, void *data) {
  if (info->dlpi_name[0] == 0) { // main program
    lo = info->dlpi_addr; hi = 0;
    for (int i = 0; i < info->dlpi_phnum; i++) {
      const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
      if (ph->p_type == PT_LOAD) { uintptr_t e = info->dlpi_addr + ph->p_vaddr + ph->p_memsz; if (e > hi) hi = e; }
    }
    return 1;
  }
  return 0;
}

static uint32_t caller(void) {
  void *bt[16];
  int n = backtrace(bt, 16);
  for (int i = 2; i < n; i++) {
    uintptr_t a = (uintptr_t)bt[i];
    if (a >= lo && a < hi) return (uint32_t)(a - lo);
  }
  return 0xffffffff;
}

static void add(void *p, size_t size) {
  if (!p || !tab || inside) return;
  inside = 1;
  uint32_t c = caller();
  lock();
  uint32_t i = h((uintptr_t)p);
  while (tab[i].p && tab[i].p != 1) i = (i + 1) & (CAP - 1);
  tab[i].p = (uintptr_t)p; tab[i].size = size; tab[i].caller = c;
  unlock();
  inside = 0;
}
static void del(void *p) {
  if (!p || !tab) return;
  lock();
  uint32_t i = h((uintptr_t)p);
  while (tab[i].p) { if (tab[i].p == (uintptr_t)p) { tab[i].p = 1; break; } i = (i + 1) & (CAP - 1); }
  unlock();
}

static void *watcher(void *arg) {
  const char *out = getenv("ALLOC_TRACE_OUT");
  char go[512]; snprintf(go, sizeof go, "%s.go", out);
  for (;;) {
    struct stat st;
    if (stat(go, &st) == 0) {
      unlink(go);
      inside = 1;
      int fd = open(out, O_WRONLY | O_CREAT | O_TRUNC, 0644);
      char line[64];
      lock();
      for (uint32_t i = 0; i < CAP; i++) if (tab[i].p > 1) {
        int n = snprintf(line, sizeof line, "%u %x\n", tab[i].size, tab[i].caller);
        write(fd, line, n);
      }
      unlock();
      close(fd);
      inside = 0;
    }
    usleep(100000);
  }
  return 0;
}

__attribute__((constructor)) static void init(void) {
  void *bt[4]; backtrace(bt, 4); // loads libgcc_s before tracing starts
  dl_iterate_phdr(phdr_cb, 0);
  tab = __libc_calloc(CAP, sizeof *tab);
  if (getenv("ALLOC_TRACE_OUT")) { pthread_t t; pthread_create(&t, 0, watcher, 0); }
}

void *malloc(size_t n) { void *p = __libc_malloc(n); add(p, n); return p; }
void *calloc(size_t a, size_t b) { void *p = __libc_calloc(a, b); add(p, a * b); return p; }
void *realloc(void *o, size_t n) { del(o); void *p = __libc_realloc(o, n); add(p, n); return p; }
void free(void *p) { del(p); __libc_free(p); }
void *memalign(size_t a, size_t n) { void *p = __libc_memalign(a, n); add(p, n); return p; }
void *aligned_alloc(size_t a, size_t n) { void *p = __libc_memalign(a, n); add(p, n); return p; }
int posix_memalign(void **r, size_t a, size_t n) { void *p = __libc_memalign(a, n); if (!p) return 12; add(p, n); *r = p; return 0; }
