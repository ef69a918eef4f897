// Counts every clock_gettime call of a process by the stack that made it (LD_PRELOAD), and
// writes the counts at exit to $CLOCK_CENSUS_OUT: one line per stack, the count then the return
// addresses. scripts/clock-census/census.sh builds it, runs a binary under it and names the
// callers. In a turmoil run every host's tokio clock is paused, so a read that remains is the
// host's real clock, and whatever it decides depends on how fast the machine ran the seed.
#define _GNU_SOURCE
#include <dlfcn.h>
#include <time.h>
#include <execinfo.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <stdint.h>
#define N 65536
#define D 10
static void *stacks[N][D]; static unsigned long counts[N]; static int inside;
static int (*real)(clockid_t, struct timespec *);
static void dump(void) {
  FILE *f = fopen(getenv("CLOCK_CENSUS_OUT") ? getenv("CLOCK_CENSUS_OUT") : "clock-census.txt", "w");
  if (!f) return;
  for (int i = 0; i < N; i++) if (counts[i]) { fprintf(f, "%lu", counts[i]); for (int j = 0; j < D; j++) fprintf(f, " %p", stacks[i][j]); fprintf(f, "\n"); }
  fclose(f);
}
int clock_gettime(clockid_t id, struct timespec *tp) {
  if (!real) { real = dlsym(RTLD_NEXT, "clock_gettime"); atexit(dump); }
  if (!inside) {
    inside = 1;
    void *b[D + 2]; int n = backtrace(b, D + 2);
    void *k[D]; memset(k, 0, sizeof k); for (int j = 2; j < n && j - 2 < D; j++) k[j - 2] = b[j];
    uint64_t h = id; for (int j = 0; j < D; j++) h = h * 1000003 ^ (uintptr_t)k[j];
    unsigned i = h % N;
    while (counts[i] && memcmp(stacks[i], k, sizeof k)) i = (i + 1) % N;
    if (!counts[i]) memcpy(stacks[i], k, sizeof k);
    counts[i]++;
    inside = 0;
  }
  return real(id, tp);
}
