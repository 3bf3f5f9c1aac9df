/* Loads libstowage.so the way PyTorch does (dlopen, RTLD_NOW | RTLD_LOCAL) into a plain C
 * process that links nothing of stowage, drives it only through dlsym'd C symbols, and prints
 * one fact per line for tests/capi_dlopen_test.cpp to check. Usage: helper <libstowage.so> */
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <time.h>

typedef void* (*malloc_fn)(ssize_t, int, void*);
typedef void (*free_fn)(void*, ssize_t, int, void*);
typedef int (*int_fn)(int);
typedef int (*void_int_fn)(void);
typedef int (*record_fn)(void*, int, void*);
typedef ssize_t (*stats_fn)(int, char*, size_t);
typedef int (*cap_fn)(int, size_t);
typedef const char* (*error_fn)(void);

static malloc_fn s_malloc;
static free_fn s_free;
static int_fn s_empty_cache;
static record_fn s_record_stream;
static stats_fn s_get_stats;
static cap_fn s_set_cap;
static void_int_fn s_device_count, s_using_cuda;
static error_fn s_last_error;

static char stats_buf[1 << 16];

static const char* stats(void) {
  ssize_t n = s_get_stats(0, stats_buf, sizeof stats_buf);
  if (n < 0 || (size_t)n >= sizeof stats_buf) stats_buf[0] = '\0';
  return stats_buf;
}

static long long stat_value(const char* json, const char* key) {
  char pattern[128];
  snprintf(pattern, sizeof pattern, "\"%s\":", key);
  const char* at = strstr(json, pattern);
  return at ? strtoll(at + strlen(pattern), NULL, 10) : -999;
}

/* Reports whether a rejected call left every statistic as it was. */
static void report_bad(const char* name, int rejected, const char* before) {
  char error[512];
  snprintf(error, sizeof error, "%s", s_last_error()); /* the next call clears it */
  const char* after = stats();
  printf("bad %s rejected=%d unchanged=%d error=%s\n", name, rejected, strcmp(before, after) == 0, error);
}

static int mapped(const char* name) {
  FILE* maps = fopen("/proc/self/maps", "r");
  char line[4096];
  int found = 0;
  while (maps && fgets(line, sizeof line, maps))
    if (strstr(line, name)) found = 1;
  if (maps) fclose(maps);
  return found;
}

static void* allocate_once(void* unused) {
  (void)unused;
  void* p = s_malloc(1 << 20, 0, NULL);
  if (p) s_free(p, 1 << 20, 0, NULL);
  return p;
}

/* Uses the library from one joined thread only, then dlcloses it: its device's stream workers
 * still run code inside it, so it must stay mapped. */
static int dlclose_after_joined_thread(void* lib) {
  s_malloc = (malloc_fn)dlsym(lib, "stowage_malloc");
  s_free = (free_fn)dlsym(lib, "stowage_free");
  if (!s_malloc || !s_free) return 3;
  pthread_t thread;
  void* result = NULL;
  if (pthread_create(&thread, NULL, allocate_once, NULL) != 0) return 5;
  pthread_join(thread, &result);
  printf("joined %s\n", result ? "ok" : "FAIL");
  dlclose(lib);
  const struct timespec pause = {0, 50 * 1000 * 1000};
  nanosleep(&pause, NULL); /* the stream workers run on */
  printf("after_dlclose stowage=%d\n", mapped("libstowage"));
  return 0;
}

int main(int argc, char** argv) {
  if (argc != 2) return 64;
  void* lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    printf("dlopen FAIL %s\n", dlerror());
    return 2;
  }
  printf("dlopen ok\n");
  if (getenv("HELPER_DLCLOSE_AFTER_JOINED_THREAD")) return dlclose_after_joined_thread(lib);
#define LOAD(var, type, name)          \
  var = (type)dlsym(lib, name);        \
  if (!var) {                          \
    printf("symbols FAIL %s\n", name); \
    return 3;                          \
  }
  LOAD(s_malloc, malloc_fn, "stowage_malloc")
  LOAD(s_free, free_fn, "stowage_free")
  LOAD(s_empty_cache, int_fn, "stowage_empty_cache")
  LOAD(s_record_stream, record_fn, "stowage_record_stream")
  LOAD(s_get_stats, stats_fn, "stowage_get_stats")
  LOAD(s_set_cap, cap_fn, "stowage_set_memory_cap")
  LOAD(s_device_count, void_int_fn, "stowage_device_count")
  LOAD(s_using_cuda, void_int_fn, "stowage_using_cuda")
  LOAD(s_last_error, error_fn, "stowage_last_error")
  if (!dlsym(lib, "stowage_reset_peak_stats") || !dlsym(lib, "stowage_snapshot")) {
    printf("symbols FAIL stats/snapshot\n");
    return 3;
  }
  printf("symbols ok\n");
  printf("devices %d cuda=%d\n", s_device_count(), s_using_cuda());

  const ssize_t mib = 1 << 20;
  unsigned char* p = (unsigned char*)s_malloc(mib, 0, NULL);
  if (!p) {
    printf("malloc FAIL %s\n", s_last_error());
    return 4;
  }
  if (s_using_cuda() == 0) { /* emulated device memory is host memory */
    memset(p, 0x5A, (size_t)mib);
    printf("bytes %s\n", p[0] == 0x5A && p[mib - 1] == 0x5A ? "ok" : "FAIL");
  } else {
    printf("bytes ok\n");
  }
  const char* s = stats();
  printf("live allocations=%lld requested=%lld\n", stat_value(s, "allocation.all.current"),
         stat_value(s, "requested_bytes.all.current"));

  char before[sizeof stats_buf];
  int local = 0;
  strcpy(before, stats());
  s_free(&local, sizeof local, 0, NULL);
  report_bad("foreign_free", s_last_error()[0] != '\0', before);
  s_free(p, mib + 1, 0, NULL);
  report_bad("wrong_size", s_last_error()[0] != '\0', before);
  s_free(p, mib, 99, NULL);
  report_bad("wrong_device", s_last_error()[0] != '\0', before);
  s_free(p, -mib, 0, NULL);
  report_bad("negative_free", s_last_error()[0] != '\0', before);
  report_bad("negative_malloc", s_malloc(-1, 0, NULL) == NULL && s_last_error()[0] != '\0', before);
  report_bad("record_foreign", s_record_stream(&local, 0, NULL) == -1, before);

  void* q = s_malloc(4096, 0, NULL);
  s_free(q, 4096, 0, NULL);
  strcpy(before, stats());
  s_free(q, 4096, 0, NULL);
  report_bad("double_free", s_last_error()[0] != '\0', before);

  s_set_cap(0, 8 * (size_t)mib);
  strcpy(before, stats());
  void* big = s_malloc(64 * mib, 0, NULL);
  char cap_error[512];
  snprintf(cap_error, sizeof cap_error, "%s", s_last_error());
  s = stats();
  printf("bad beyond_cap rejected=%d unchanged=%d error=%s\n", big == NULL,
         stat_value(s, "allocated_bytes.all.current") == stat_value(before, "allocated_bytes.all.current") &&
             stat_value(s, "reserved_bytes.all.current") == stat_value(before, "reserved_bytes.all.current") &&
             stat_value(s, "allocation.all.allocated") == stat_value(before, "allocation.all.allocated"),
         cap_error);
  s_set_cap(0, 0);

  /* Keeps working: a burst of allocations of many sizes, all freed. */
  void* blocks[100];
  int ok = 1;
  for (int i = 0; i < 100; ++i) {
    blocks[i] = s_malloc((ssize_t)(1 + i * 37777), 0, NULL);
    ok &= blocks[i] != NULL;
  }
  for (int i = 99; i >= 0; --i) s_free(blocks[i], (ssize_t)(1 + i * 37777), 0, NULL);
  s_free(p, mib, 0, NULL);
  ok &= s_last_error()[0] == '\0';
  printf("continue %s live=%lld\n", ok ? "ok" : "FAIL", stat_value(stats(), "allocation.all.current"));
  s_empty_cache(0);
  printf("empty_cache reserved=%lld\n", stat_value(stats(), "reserved_bytes.all.current"));

  /* What the dynamic loader brought in with the library. */
  printf("mapped stowage=%d jemalloc=%d\n", mapped("libstowage"), mapped("jemalloc"));
  return 0;
}
