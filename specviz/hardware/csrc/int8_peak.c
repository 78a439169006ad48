/* The int8 multiply-add peak of the instructions specviz's int8 kernels run (specviz/hardware/peak.py).
 *
 * One tight loop per instruction set, each on independent accumulators (enough of them to hide the latency,
 * so only the units' throughput limits it), on registers only: no memory is read, the figure is arithmetic's
 * ceiling.  Counting one multiply-add per u8 x s8 product:
 *
 *   ISA_AVX2     vpmaddubsw + vpmaddwd + vpaddd (256-bit): 32 a group of three instructions -- int8_small.cpp's
 *                and q4k.cpp's AVX2 form;
 *   ISA_VNNI256  vpdpbusd ymm (AVX-512 VNNI + VL): 32 an instruction -- q4k.cpp's and q6k.cpp's VNNI form;
 *   ISA_VNNI512  vpdpbusd zmm (AVX-512 VNNI): 64 an instruction -- fbgemm's int8 rows on an AVX-512 CPU;
 *   ISA_AMX      tdpbusd on 16x64 tiles (AMX-INT8): 16 x 16 x 64 an instruction (no kernel of specviz's uses it).
 *
 * specviz_int8_peak(isa, iters, threads) runs ``iters`` rounds of the loop on each of ``threads`` POSIX threads,
 * started together, and returns the multiply-adds per second of them all (wall time from the start to the last
 * thread's end), or a negative code: the loop is not compiled here, the CPU lacks the instructions (CPUID), the
 * operating system has not enabled their registers (XCR0; for AMX, Linux's permission to use the tiles), or a
 * thread could not start.  The CPU is asked before any of the instructions runs: no SIGILL, whatever the caller
 * believes the CPU has.
 *
 * Plain C, no torch headers: it compiles in well under a second, where the probe is waiting for it.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* syscall() */
#endif
#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <time.h>

enum { ISA_AVX2 = 0, ISA_VNNI256 = 1, ISA_VNNI512 = 2, ISA_AMX = 3 };
enum { PEAK_UNKNOWN = -1, PEAK_NO_CPU = -2, PEAK_NO_OS = -3, PEAK_NO_THREAD = -4 };

volatile int64_t specviz_peak_sink; /* the accumulators' sum: they are live, the loop is not optimised away */

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__)) && !defined(SPECVIZ_PEAK_NO_X86)
#include <cpuid.h>
#include <immintrin.h>
#if (defined(__clang__) && __clang_major__ >= 13) || (!defined(__clang__) && __GNUC__ >= 11)
#define SPECVIZ_AMX 1 /* the compiler knows the tile intrinsics */
#endif
#ifdef __linux__
#include <sys/syscall.h>
#include <unistd.h>
#endif

static uint64_t xcr0(void) {
  uint32_t a, d;
  __asm__ volatile("xgetbv" : "=a"(a), "=d"(d) : "c"(0));
  return ((uint64_t)d << 32) | a;
}

/* 0 where the CPU has the instructions and the OS saves their registers, else PEAK_NO_CPU / PEAK_NO_OS. */
static int supported(int isa) {
  unsigned a, b, c, d;
  if (!__get_cpuid(1, &a, &b, &c, &d) || !(c & (1u << 27))) return PEAK_NO_CPU; /* no OSXSAVE: no xgetbv */
  if (__get_cpuid_max(0, 0) < 7) return PEAK_NO_CPU;
  __cpuid_count(7, 0, a, b, c, d);
  int avx2 = (b >> 5) & 1, f = (b >> 16) & 1, vl = (b >> 31) & 1, vnni = (c >> 11) & 1;
  int tile = (d >> 24) & 1, tint8 = (d >> 25) & 1;
  uint64_t x = xcr0();
  int ymm = (x & 0x6) == 0x6, zmm = ymm && (x & 0xE0) == 0xE0, tiles = (x & 0x60000) == 0x60000;
  switch (isa) {
    case ISA_AVX2: return !avx2 ? PEAK_NO_CPU : ymm ? 0 : PEAK_NO_OS;
    case ISA_VNNI256: return !(f && vl && vnni) ? PEAK_NO_CPU : zmm ? 0 : PEAK_NO_OS;
    case ISA_VNNI512: return !(f && vnni) ? PEAK_NO_CPU : zmm ? 0 : PEAK_NO_OS;
    case ISA_AMX: return !(tile && tint8) ? PEAK_NO_CPU : tiles ? 0 : PEAK_NO_OS;
  }
  return PEAK_UNKNOWN;
}

/* The loops' bodies are written out in assembly: exactly the instructions counted, each accumulator in a register of
 * its own, nothing the compiler could compute once and reuse.  AT&T order: "vpdpbusd b, a, c" is c += a (u8) . b (s8).
 */
#define MADD(t, c) "vpmaddubsw %[b], %[a], %[" #t "]\n\tvpmaddwd %[ones], %[" #t "], %[" #t "]\n\t" \
                   "vpaddd %[" #t "], %[" #c "], %[" #c "]\n\t"
#define DPBUSD(c) "vpdpbusd %[b], %[a], %[" #c "]\n\t"
/* VNNI: sixteen accumulators (of AVX-512's 32 registers), in two statements (an asm takes 30 operands at most):
 * enough for a latency of 5 cycles at 2 a cycle, or 4 at 4. */
#define DPBUSD8 DPBUSD(c0) DPBUSD(c1) DPBUSD(c2) DPBUSD(c3) DPBUSD(c4) DPBUSD(c5) DPBUSD(c6) DPBUSD(c7)
#define ACCS(p, q, r, s, t, u, v, w) [c0] "+v"(p), [c1] "+v"(q), [c2] "+v"(r), [c3] "+v"(s), \
                                     [c4] "+v"(t), [c5] "+v"(u), [c6] "+v"(v), [c7] "+v"(w)
/* The loop over rounds, its accumulators c0..c15 each a variable of its own: an array would live in memory. */
#define VNNI_LOOP                                                                                          \
  for (int64_t n = 0; n < iters; n++) {                                                                    \
    __asm__ volatile(DPBUSD8 : ACCS(c0, c1, c2, c3, c4, c5, c6, c7) : [a] "v"(a), [b] "v"(b));             \
    __asm__ volatile(DPBUSD8 : ACCS(c8, c9, c10, c11, c12, c13, c14, c15) : [a] "v"(a), [b] "v"(b));       \
  }

__attribute__((target("avx2"))) static int64_t loop_avx2(int64_t iters) {
  __m256i a = _mm256_set1_epi8(3), b = _mm256_set1_epi8(-2), ones = _mm256_set1_epi16(1), t0, t1, t2, t3;
  __m256i c0 = _mm256_setzero_si256(), c1 = c0, c2 = c0, c3 = c0, c4 = c0, c5 = c0, c6 = c0, c7 = c0;
  for (int64_t n = 0; n < iters; n++) {  /* 16 ymm registers: eight accumulators, four products in flight */
    __asm__ volatile(MADD(t0, c0) MADD(t1, c1) MADD(t2, c2) MADD(t3, c3)
                     MADD(t0, c4) MADD(t1, c5) MADD(t2, c6) MADD(t3, c7)
                     : [t0] "=&x"(t0), [t1] "=&x"(t1), [t2] "=&x"(t2), [t3] "=&x"(t3),
                       [c0] "+x"(c0), [c1] "+x"(c1), [c2] "+x"(c2), [c3] "+x"(c3),
                       [c4] "+x"(c4), [c5] "+x"(c5), [c6] "+x"(c6), [c7] "+x"(c7)
                     : [a] "x"(a), [b] "x"(b), [ones] "x"(ones));
  }
  __m256i s = _mm256_add_epi32(_mm256_add_epi32(_mm256_add_epi32(c0, c1), _mm256_add_epi32(c2, c3)),
                               _mm256_add_epi32(_mm256_add_epi32(c4, c5), _mm256_add_epi32(c6, c7)));
  return _mm256_extract_epi32(s, 0);
}

#define SUM16(add) add(add(add(add(c0, c1), add(c2, c3)), add(add(c4, c5), add(c6, c7))), \
                       add(add(add(c8, c9), add(c10, c11)), add(add(c12, c13), add(c14, c15))))

__attribute__((target("avx512f,avx512vl,avx512vnni"))) static int64_t loop_vnni256(int64_t iters) {
  __m256i a = _mm256_set1_epi8(3), b = _mm256_set1_epi8(-2), c0 = _mm256_setzero_si256(), c1 = c0, c2 = c0, c3 = c0,
          c4 = c0, c5 = c0, c6 = c0, c7 = c0, c8 = c0, c9 = c0, c10 = c0, c11 = c0, c12 = c0, c13 = c0, c14 = c0,
          c15 = c0;
  VNNI_LOOP
  return _mm256_extract_epi32(SUM16(_mm256_add_epi32), 0);
}

__attribute__((target("avx512f,avx512vnni"))) static int64_t loop_vnni512(int64_t iters) {
  __m512i a = _mm512_set1_epi8(3), b = _mm512_set1_epi8(-2), c0 = _mm512_setzero_si512(), c1 = c0, c2 = c0, c3 = c0,
          c4 = c0, c5 = c0, c6 = c0, c7 = c0, c8 = c0, c9 = c0, c10 = c0, c11 = c0, c12 = c0, c13 = c0, c14 = c0,
          c15 = c0;
  VNNI_LOOP
  return _mm512_reduce_add_epi32(SUM16(_mm512_add_epi32));
}

#ifdef SPECVIZ_AMX
typedef struct {
  uint8_t palette, start_row, reserved[14];
  uint16_t colsb[16];
  uint8_t rows[16];
} tile_config;

/* Linux lends a process the tiles' 8 KB of state only when asked (5.16 and later). */
static int amx_permitted(void) {
#if defined(__linux__) && defined(SYS_arch_prctl)
  unsigned long granted = 0;
  if (syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XTILEDATA */) != 0) return 0;
  if (syscall(SYS_arch_prctl, 0x1022 /* ARCH_GET_XCOMP_PERM */, &granted) != 0) return 0;
  return (granted >> 18) & 1;
#else
  return 0;
#endif
}

/* Four accumulating tiles (0-3), each C += A B with A in tile 4 or 5 and B in tile 6 or 7: four independent chains. */
__attribute__((target("amx-tile,amx-int8"))) static int64_t loop_amx(int64_t iters) {
  static const int8_t zeros[16 * 64] __attribute__((aligned(64))) = {0};
  int32_t out[16 * 16] __attribute__((aligned(64)));
  tile_config cfg = {0};
  cfg.palette = 1;
  for (int t = 0; t < 8; t++) cfg.colsb[t] = 64, cfg.rows[t] = 16;
  _tile_loadconfig(&cfg);
  _tile_zero(0); _tile_zero(1); _tile_zero(2); _tile_zero(3);
  _tile_loadd(4, zeros, 64); _tile_loadd(5, zeros, 64); _tile_loadd(6, zeros, 64); _tile_loadd(7, zeros, 64);
  for (int64_t n = 0; n < iters; n++) {
    _tile_dpbusd(0, 4, 6); _tile_dpbusd(1, 4, 7); _tile_dpbusd(2, 5, 6); _tile_dpbusd(3, 5, 7);
  }
  _tile_stored(0, out, 64);
  _tile_release();
  return out[0];
}
#endif

static int64_t macs_per_round(int isa) {
  return isa == ISA_AVX2 ? 8 * 32 : isa == ISA_VNNI256 ? 16 * 32 : isa == ISA_VNNI512 ? 16 * 64 : 4 * 16 * 16 * 64;
}

static int64_t run_loop(int isa, int64_t iters) {
  switch (isa) {
    case ISA_AVX2: return loop_avx2(iters);
    case ISA_VNNI256: return loop_vnni256(iters);
    case ISA_VNNI512: return loop_vnni512(iters);
#ifdef SPECVIZ_AMX
    case ISA_AMX: return loop_amx(iters);
#endif
  }
  return 0;
}

static int compiled(int isa) {
#ifdef SPECVIZ_AMX
  return isa >= ISA_AVX2 && isa <= ISA_AMX;
#else
  return isa >= ISA_AVX2 && isa <= ISA_VNNI512;
#endif
}
#else /* not x86-64: no loop here */
static int supported(int isa) { (void)isa; return PEAK_NO_CPU; }
static int compiled(int isa) { (void)isa; return 0; }
static int64_t macs_per_round(int isa) { (void)isa; return 0; }
static int64_t run_loop(int isa, int64_t iters) { (void)isa; (void)iters; return 0; }
#endif

typedef struct {
  int isa;
  int64_t iters;
  volatile int *go;
  volatile int *ready;
  int64_t result;
} job;

static void *worker(void *arg) {
  job *j = (job *)arg;
  __atomic_add_fetch(j->ready, 1, __ATOMIC_SEQ_CST);
  while (!__atomic_load_n(j->go, __ATOMIC_ACQUIRE)) sched_yield(); /* the others may need this core to start */
  j->result = run_loop(j->isa, j->iters);
  return 0;
}

static double seconds(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

int specviz_int8_peak_supported(int isa) {
  if (!compiled(isa)) return PEAK_UNKNOWN;
  return supported(isa);
}

double specviz_int8_peak(int isa, int64_t iters, int threads) {
  enum { MAX_THREADS = 1024 };
  int why = specviz_int8_peak_supported(isa);
  if (why != 0) return why;
#if defined(SPECVIZ_AMX)
  if (isa == ISA_AMX && !amx_permitted()) return PEAK_NO_OS;
#endif
  if (threads < 1 || threads > MAX_THREADS || iters < 1) return PEAK_UNKNOWN;
  static job jobs[MAX_THREADS];
  static pthread_t ids[MAX_THREADS];
  static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER; /* one measurement at a time: the jobs are shared */
  volatile int go = 0, ready = 0;
  pthread_mutex_lock(&lock);
  int started = 0;
  for (; started < threads; started++) {
    jobs[started] = (job){isa, iters, &go, &ready, 0};
    if (pthread_create(&ids[started], 0, worker, &jobs[started]) != 0) break;
  }
  while (__atomic_load_n(&ready, __ATOMIC_ACQUIRE) < started) sched_yield();
  double t0 = seconds();
  __atomic_store_n(&go, 1, __ATOMIC_RELEASE);
  int64_t sum = 0;
  for (int i = 0; i < started; i++) {
    pthread_join(ids[i], 0);
    sum += jobs[i].result;
  }
  double took = seconds() - t0;
  pthread_mutex_unlock(&lock);
  specviz_peak_sink = sum;
  if (started < threads) return PEAK_NO_THREAD;
  return took > 0 ? (double)threads * (double)iters * (double)macs_per_round(isa) / took : PEAK_UNKNOWN;
}
