/* memload: a memory workload for testing and measuring incremental CRIU dumps
 * (native/criu/test/chain-test.py). It holds memory with a known pattern and
 * changes it one step at a time; at each step it records a hash of every MiB
 * it holds, so that a restored copy can be checked byte for byte.
 *
 *   memload DIR MIB MODE      (MODE: mixed | bench; run under setsid, stdio /dev/null)
 *
 * SIGUSR1: do the next step, then write DIR/step-K-ROLE.sums (K counts steps).
 * SIGUSR2: write DIR/verify-ROLE.sums with the hashes of the memory as it is now
 *          (the same format: a restored process must match its step file).
 * ROLE is "main" or "child" (the child forked at step 2 in mixed mode; the main
 * process forwards both signals to it). Files are written to a temporary name
 * and renamed, and no file stays open, so CRIU can dump the process any time
 * it waits.
 *
 * bench: each step writes 256 random pages (1 MiB) of the main region.
 * mixed: also new mappings, mremap, a sparse region, madvise(MADV_DONTNEED)
 *        on anonymous and file-backed private pages, writes made by the kernel
 *        (pread into the region), a forked child that changes its own copy,
 *        huge pages (MADV_HUGEPAGE), a MAP_FIXED mapping over part of a
 *        region, an mprotect round trip. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#define MIB (1024UL * 1024UL)
#define PAGE 4096UL
#define MAX_REGIONS 16

struct region {
  const char *name;
  unsigned char *addr;
  size_t len;
};

static struct region regions[MAX_REGIONS];
static int nr_regions;
static const char *dir;
static const char *role = "main";
static pid_t child = -1;
static int step;
static uint64_t rng = 88172645463325252ULL;
static volatile sig_atomic_t want_step, want_verify;

static uint64_t next_rand(void) {
  rng ^= rng << 13;
  rng ^= rng >> 7;
  rng ^= rng << 17;
  return rng;
}

static void die(const char *what) {
  perror(what);
  exit(1);
}

static void add_region(const char *name, void *addr, size_t len) {
  if (nr_regions == MAX_REGIONS) {
    fprintf(stderr, "too many regions\n");
    exit(1);
  }
  regions[nr_regions].name = name;
  regions[nr_regions].addr = addr;
  regions[nr_regions].len = len;
  nr_regions++;
}

static struct region *find_region(const char *name) {
  for (int i = 0; i < nr_regions; i++)
    if (!strcmp(regions[i].name, name)) return &regions[i];
  return NULL;
}

static void *map_anon(size_t len) {
  void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) die("mmap");
  return p;
}

/* A page's content: its address, the step and a random word, spread over it. */
static void write_page(unsigned char *page) {
  uint64_t v = next_rand() ^ ((uint64_t)step << 56) ^ (uint64_t)(uintptr_t)page;
  for (size_t i = 0; i < PAGE; i += 64) memcpy(page + i, &v, sizeof(v)), v = v * 6364136223846793005ULL + 1;
}

static void write_random_pages(struct region *r, size_t pages) {
  for (size_t i = 0; i < pages; i++) write_page(r->addr + (next_rand() % (r->len / PAGE)) * PAGE);
}

static uint64_t hash(const unsigned char *p, size_t len) {
  uint64_t h = 1469598103934665603ULL;
  for (size_t i = 0; i < len; i += 8) {
    uint64_t w;
    memcpy(&w, p + i, 8);
    h = (h ^ w) * 1099511628211ULL;
  }
  return h;
}

static void write_sums(const char *name) {
  char path[4096], tmp[4200];
  FILE *f;

  snprintf(path, sizeof(path), "%s/%s", dir, name);
  snprintf(tmp, sizeof(tmp), "%s.tmp.%d", path, getpid());
  f = fopen(tmp, "w");
  if (!f) die(tmp);
  fprintf(f, "step %d\n", step);
  for (int i = 0; i < nr_regions; i++) {
    struct region *r = &regions[i];
    for (size_t off = 0; off < r->len; off += MIB) {
      size_t n = r->len - off < MIB ? r->len - off : MIB;
      fprintf(f, "%s %p+%zu %016llx\n", r->name, (void *)r->addr, off / MIB,
              (unsigned long long)hash(r->addr + off, n));
    }
  }
  if (fclose(f)) die("fclose");
  if (rename(tmp, path)) die("rename");
}

static void on_signal(int sig) {
  if (sig == SIGUSR1) want_step = 1;
  if (sig == SIGUSR2) want_verify = 1;
}

static const char *data_file(void) {
  static char path[4096];
  snprintf(path, sizeof(path), "%s/memload.data", dir);
  return path;
}

/* The child's own change at each step: its copy of the main region. */
static void child_step(void) { write_random_pages(find_region("main"), 64); }

static void mixed_step(size_t mib) {
  struct region *m = find_region("main");
  unsigned char *p;
  int fd;

  write_random_pages(m, 256);
  switch (step % 6) {
    case 1: { /* a new mapping, partly written */
      p = map_anon(4 * MIB);
      for (size_t i = 0; i < 4 * MIB; i += 3 * PAGE) write_page(p + i);
      add_region(step == 1 ? "new1" : "new7", p, 4 * MIB);
      break;
    }
    case 2: { /* a child with its own changes; the sparse region gets a few pages */
      struct region *s = find_region("sparse");
      for (int i = 0; i < 5; i++) write_page(s->addr + (next_rand() % (s->len / PAGE)) * PAGE);
      if (child < 0) {
        child = fork();
        if (child < 0) die("fork");
        if (child == 0) {
          role = "child";
          child = -1;
          rng ^= 0x5555;
          child_step();
        }
      }
      break;
    }
    case 3: { /* mremap a tracked region to a new place, and grow it */
      struct region *r = find_region("movable");
      p = mremap(r->addr, r->len, r->len + MIB, MREMAP_MAYMOVE);
      if (p == MAP_FAILED) die("mremap");
      r->addr = p;
      r->len += MIB;
      write_page(p + r->len - PAGE);
      break;
    }
    case 4: { /* drop pages: anonymous ones read as zero, file ones as the file */
      madvise(m->addr + (next_rand() % (m->len / MIB)) * MIB, 16 * PAGE, MADV_DONTNEED);
      struct region *f = find_region("file");
      madvise(f->addr + PAGE, 2 * PAGE, MADV_DONTNEED);
      write_page(f->addr + 4 * PAGE);
      break;
    }
    case 5: { /* the kernel writes into the region */
      fd = open(data_file(), O_RDONLY);
      if (fd < 0) die("open data");
      for (int i = 0; i < 8; i++)
        if (pread(fd, m->addr + (next_rand() % (m->len / PAGE)) * PAGE, PAGE, (off_t)(i * PAGE)) != (ssize_t)PAGE)
          die("pread");
      close(fd);
      break;
    }
    default: { /* step 6, 12...: replace 1 MiB of the main region by a fresh mapping; mprotect round trip */
      p = mmap(m->addr + MIB, MIB, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
      if (p == MAP_FAILED) die("mmap fixed");
      write_page(p + 7 * PAGE);
      if (mprotect(m->addr, m->len, PROT_READ) || mprotect(m->addr, m->len, PROT_READ | PROT_WRITE)) die("mprotect");
      write_random_pages(m, 16);
      break;
    }
  }
  write_random_pages(find_region("huge"), 4);
  (void)mib;
}

int main(int argc, char **argv) {
  struct sigaction sa = {.sa_handler = on_signal};
  sigset_t block, old;
  size_t mib;
  int mixed;

  if (argc != 4) {
    fprintf(stderr, "usage: %s DIR MIB mixed|bench\n", argv[0]);
    return 2;
  }
  dir = argv[1];
  mib = strtoul(argv[2], NULL, 10);
  mixed = !strcmp(argv[3], "mixed");

  unsigned char *m = map_anon(mib * MIB);
  for (size_t i = 0; i < mib * MIB; i += PAGE) write_page(m + i);
  add_region("main", m, mib * MIB);
  if (mixed) {
    unsigned char *s = map_anon(64 * MIB); /* mostly never touched */
    write_page(s);
    add_region("sparse", s, 64 * MIB);
    unsigned char *v = map_anon(2 * MIB);
    for (size_t i = 0; i < 2 * MIB; i += PAGE) write_page(v + i);
    add_region("movable", v, 2 * MIB);
    /* transparent huge pages where the kernel gives them (THP is "madvise" here) */
    unsigned char *h = map_anon(10 * MIB);
    unsigned char *ha = (unsigned char *)(((uintptr_t)h + 2 * MIB - 1) & ~(2 * MIB - 1));
    madvise(ha, 8 * MIB, MADV_HUGEPAGE);
    for (size_t i = 0; i < 8 * MIB; i += PAGE) write_page(ha + i);
    add_region("huge", ha, 8 * MIB);
    /* a file mapped private: some pages copied on write, some dropped back */
    int fd = open(data_file(), O_RDWR | O_CREAT | O_TRUNC, 0600);
    if (fd < 0) die("data file");
    unsigned char buf[PAGE];
    for (int i = 0; i < 16; i++) {
      memset(buf, 'a' + i, sizeof(buf));
      if (write(fd, buf, sizeof(buf)) != (ssize_t)sizeof(buf)) die("write data");
    }
    unsigned char *f = mmap(NULL, 16 * PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0);
    if (f == MAP_FAILED) die("mmap file");
    close(fd);
    for (int i = 0; i < 8; i++) write_page(f + i * PAGE);
    add_region("file", f, 16 * PAGE);
  }

  sigaction(SIGUSR1, &sa, NULL);
  sigaction(SIGUSR2, &sa, NULL);
  sigemptyset(&block);
  sigaddset(&block, SIGUSR1);
  sigaddset(&block, SIGUSR2);
  sigprocmask(SIG_BLOCK, &block, &old);

  char name[256];
  snprintf(name, sizeof(name), "step-0-%s.sums", role);
  write_sums(name);
  for (;;) {
    while (!want_step && !want_verify) sigsuspend(&old);
    if (want_step) {
      pid_t had_child = child; /* a child forked in this step has done it already */
      want_step = 0;
      step++;
      if (!strcmp(role, "child"))
        child_step();
      else if (mixed)
        mixed_step(mib);
      else
        write_random_pages(find_region("main"), 256);
      if (had_child > 0) kill(child, SIGUSR1);
      snprintf(name, sizeof(name), "step-%d-%s.sums", step, role);
      write_sums(name);
    }
    if (want_verify) {
      want_verify = 0;
      if (child > 0) kill(child, SIGUSR2);
      snprintf(name, sizeof(name), "verify-%s.sums", role);
      write_sums(name);
    }
  }
}
