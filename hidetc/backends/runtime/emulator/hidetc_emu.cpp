/* hidetc_emu.cpp -- the emulator's scheduler: CUDA launches on one CPU thread.
 *
 * A launch runs its blocks one after another (x fastest, then y, then z). The threads
 * of a block are fibers, each with its own stack (mmap'ed, with a guard page, reused
 * across the launch's blocks, released when it ends), run round-robin in thread order
 * on the calling OS thread. A fiber runs until it finishes or blocks:
 *
 * - __syncthreads(): the fiber waits until every non-exited thread of the block waits
 *   at a barrier (a thread that has exited counts as arrived, as on sm_70+); all must
 *   wait at the same source line, else the launch fails (divergent barriers are
 *   undefined behaviour in CUDA).
 * - warp collectives (shuffles, votes, __syncwarp, ldmatrix, mma): the lane deposits
 *   its operands and waits until every participant -- the lanes of `mask` that exist
 *   (a partial last warp has fewer than 32) and have not exited -- waits at a collective
 *   with the same mask; then the last one to arrive computes every participant's result
 *   and all continue. Participants at different kinds of collective fail the launch.
 *   ldmatrix and mma need all 32 lanes of the warp.
 *
 * When no fiber can run and the block is not finished, the launch fails with a
 * deadlock report (who waits where). Failures return nonzero from hidetc_emu_launch;
 * hidetc_emu_last_error() has the message. Shared memory is poisoned when a block
 * starts and, with the checks on (hidetc_emu_set_race_checks), shadowed per 2-byte unit
 * (races, uninitialized loads, loads of copies in flight); global memory errors are not
 * detected here (a wild write corrupts or crashes the process, as on the GPU: the
 * sanitized executor's red zones catch writes past a tensor); overflowing a fiber's
 * stack hits its guard page (SIGSEGV): raise the stack size for kernels with big local
 * arrays.
 *
 * The results of the collectives are computed in hidetc_emu_resolve.cpp.
 * Context switches: hand-written x86-64 (callee-saved registers + stack pointer), or
 * ucontext elsewhere or when built with -DHIDETC_EMU_UCONTEXT. Not thread-safe: one
 * launch at a time per loaded library (the Python wrapper holds a lock). */
#include "hidetc_emu_internal.h"

#include <algorithm>
#include <cstdarg>
#include <cstdlib>
#include <cstring>
#include <string>
#include <unordered_map>
#include <sys/mman.h>
#include <unistd.h>
#include <vector>

HidetcEmuIndex *hidetc_emu_current;
uint3 hidetc_emu_block_idx;
dim3 hidetc_emu_block_dim, hidetc_emu_grid_dim;
bool hidetc_emu_checks = false;   /* shared-memory tracking (races, uninitialized, in flight) */

std::vector<hidetc_emu::Fiber> hidetc_emu::g_fibers;

using namespace hidetc_emu;

namespace {

std::vector<char *> g_stacks;
size_t g_stack_size = 256 * 1024;
bool g_reverse = false;   /* blocks last to first, threads last to first (order independence) */
unsigned g_epoch = 1;     /* the block's barrier interval (its barriers released + 1) */

/* Per 2-byte unit of shared memory: the last store (thread, interval, line, its warp's
 * sync count), the warps that loaded it in the current interval and the last reader. */
struct Shadow {
  unsigned w_epoch = 0, r_epoch = 0, reader_warps = 0, w_sync = 0, r_sync = 0;
  int writer = -1, w_line = 0, reader = -1, r_line = 0;
  bool written = false, pending = false;   /* stored in this block; a cp.async in flight */
  const char *w_array = "", *r_array = "";
};
std::unordered_map<uintptr_t, Shadow> g_shadow;
std::vector<int> g_runq;
size_t g_runq_head;
std::vector<unsigned> g_exited, g_waiting;  /* per warp: lane bitmasks */
/* per warp: how many warp-wide synchronizations (a collective every live lane joined:
 * __syncwarp, a full-mask shuffle or vote, ldmatrix, mma) it has passed in this block */
std::vector<unsigned> g_warp_sync;
int g_nthreads, g_nexited, g_nbarrier;
void (*g_entry)(void **);
void **g_args;
bool g_failed;
std::string g_error;
unsigned long long g_switches;

#ifdef HIDETC_EMU_USE_UCONTEXT
ucontext_t g_sched_ctx;
#else
void *g_sched_sp;
#endif

Fiber *cur() { return static_cast<Fiber *>(hidetc_emu_current); }

/* ---- context switching ---------------------------------------------------------- */
#ifndef HIDETC_EMU_USE_UCONTEXT
extern "C" void hidetc_emu_switch(void **save_sp, void *new_sp);
extern "C" void hidetc_emu_fiber_start(void);
asm(R"(
  .text
  .p2align 4
  .globl hidetc_emu_switch
  .hidden hidetc_emu_switch
  .type hidetc_emu_switch,@function
hidetc_emu_switch:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .size hidetc_emu_switch, .-hidetc_emu_switch
  .globl hidetc_emu_fiber_start
  .hidden hidetc_emu_fiber_start
  .type hidetc_emu_fiber_start,@function
hidetc_emu_fiber_start:
  movq %r12, %rdi
  andq $-16, %rsp
  callq *%rbx
  ud2
  .size hidetc_emu_fiber_start, .-hidetc_emu_fiber_start
)");
#endif

void fiber_main(Fiber *f);

void switch_to_fiber(Fiber *f) {
  hidetc_emu_current = f;
  g_switches++;
#ifdef HIDETC_EMU_USE_UCONTEXT
  swapcontext(&g_sched_ctx, &f->ctx);
#else
  hidetc_emu_switch(&g_sched_sp, f->sp);
#endif
}

void switch_to_scheduler(Fiber *f) {
  g_switches++;
#ifdef HIDETC_EMU_USE_UCONTEXT
  swapcontext(&f->ctx, &g_sched_ctx);
#else
  hidetc_emu_switch(&f->sp, g_sched_sp);
#endif
}

#ifdef HIDETC_EMU_USE_UCONTEXT
void fiber_main_uc(unsigned hi, unsigned lo) {
  fiber_main(reinterpret_cast<Fiber *>(((uintptr_t)hi << 32) | (uintptr_t)lo));
}
#endif

void init_fiber(Fiber *f) {
#ifdef HIDETC_EMU_USE_UCONTEXT
  getcontext(&f->ctx);
  f->ctx.uc_stack.ss_sp = f->stack;
  f->ctx.uc_stack.ss_size = g_stack_size;
  f->ctx.uc_link = nullptr;
  uintptr_t p = reinterpret_cast<uintptr_t>(f);
  makecontext(&f->ctx, (void (*)())fiber_main_uc, 2, (unsigned)(p >> 32), (unsigned)p);
#else
  uintptr_t top = (reinterpret_cast<uintptr_t>(f->stack) + g_stack_size) & ~(uintptr_t)15;
  void **s = reinterpret_cast<void **>(top - 64);  /* popped: r15 r14 r13 r12 rbx rbp, ret */
  for (int i = 0; i < 8; i++) s[i] = nullptr;
  s[3] = f;                                        /* r12: the argument */
  s[4] = reinterpret_cast<void *>(&fiber_main);    /* rbx: the function */
  s[6] = reinterpret_cast<void *>(&hidetc_emu_fiber_start);
  f->sp = s;
#endif
}

/* ---- stacks --------------------------------------------------------------------- */
void free_stacks() {
  size_t page = (size_t)sysconf(_SC_PAGESIZE);
  for (char *s : g_stacks) munmap(s - page, g_stack_size + page);
  g_stacks.clear();
}

bool ensure_stacks(int n) {
  size_t page = (size_t)sysconf(_SC_PAGESIZE);
  while ((int)g_stacks.size() < n) {
    void *m = mmap(nullptr, g_stack_size + page, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (m == MAP_FAILED) return false;
    mprotect(m, page, PROT_NONE);                  /* guard page below the stack */
    g_stacks.push_back(static_cast<char *>(m) + page);
  }
  return true;
}

/* ---- errors --------------------------------------------------------------------- */
void set_error(const char *fmt, ...) {
  char buf[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  if (!g_failed) g_error = buf;
  g_failed = true;
}

std::string block_text() {
  char buf[96];
  snprintf(buf, sizeof buf, "block (%u, %u, %u)", hidetc_emu_block_idx.x,
           hidetc_emu_block_idx.y, hidetc_emu_block_idx.z);
  return buf;
}

/* ---- warps ---------------------------------------------------------------------- */
unsigned existing_lanes(int warp) {
  int n = g_nthreads - warp * 32;
  return n >= 32 ? 0xffffffffu : (1u << n) - 1u;
}

void push_runnable(Fiber *f) {
  f->state = RUNNABLE;
  g_runq.push_back(f->id);
}

void resolve(int kind, int warp, unsigned part) {
  if (kind >= HIDETC_EMU_SHFL_IDX && kind <= HIDETC_EMU_SHFL_XOR) resolve_shfl(kind, warp, part);
  else if (kind >= HIDETC_EMU_BALLOT && kind <= HIDETC_EMU_ALL) resolve_vote(kind, warp, part);
  else if (kind >= HIDETC_EMU_LDMATRIX_X1 && kind <= HIDETC_EMU_LDMATRIX_X4_TRANS) resolve_ldmatrix(kind, warp);
  else if (kind == HIDETC_EMU_MMA_M16N8K16_F16F32) resolve_mma(warp, false);
  else if (kind == HIDETC_EMU_MMA_M16N8K16_BF16F32) resolve_mma(warp, true);
  else if (kind == HIDETC_EMU_MMA_M16N8K32_S32) resolve_mma_int8(warp);
}

/* Complete the collective over `mask` in `warp` if all its live lanes wait at it. */
bool try_resolve(int warp, unsigned mask) {
  unsigned part = mask & existing_lanes(warp) & ~g_exited[warp];
  if (!part || (g_waiting[warp] & part) != part) return false;
  int kind = -1, first = 0;
  for (int l = 0; l < 32; l++) {
    if (!(part >> l & 1)) continue;
    Fiber &g = g_fibers[warp * 32 + l];
    if (g.mask != mask) return false;        /* that lane waits on another group */
    if (kind < 0) { kind = g.kind; first = l; }
    else if (g.kind != kind)
      hidetc_emu_fail("divergent warp collectives in warp %d: lane %d at %s, lane %d at %s",
                      warp, first, kKindNames[kind], l, kKindNames[g.kind]);
  }
  resolve(kind, warp, part);
  if (part == (existing_lanes(warp) & ~g_exited[warp])) g_warp_sync[warp]++;
  g_waiting[warp] &= ~part;
  for (int l = 0; l < 32; l++) {
    Fiber *g = &g_fibers[warp * 32 + l];
    if ((part >> l & 1) && g != cur()) push_runnable(g);
    else if (part >> l & 1) g->state = RUNNABLE;
  }
  return true;
}

/* __activemask: once no live lane of `warp` can run, release those waiting at it. */
void check_activemask(int warp) {
  unsigned live = existing_lanes(warp) & ~g_exited[warp], waiting = 0;
  for (int l = 0; l < 32; l++) {
    if (!(live >> l & 1)) continue;
    const Fiber &g = g_fibers[warp * 32 + l];
    if (g.state == RUNNABLE) return;
    if (g.state == COLLECTIVE && g.kind == HIDETC_EMU_ACTIVEMASK) waiting |= 1u << l;
  }
  if (!waiting) return;
  g_waiting[warp] &= ~waiting;
  for (int l = 0; l < 32; l++) {
    if (!(waiting >> l & 1)) continue;
    Fiber *g = &g_fibers[warp * 32 + l];
    std::memcpy(g->out, &waiting, sizeof waiting);
    if (g != cur()) push_runnable(g);
    else g->state = RUNNABLE;
  }
}

void fiber_main(Fiber *f) {
  g_entry(g_args);
  int warp = f->id / 32;
  f->state = EXITED;
  g_nexited++;
  g_exited[warp] |= 1u << (f->id % 32);
  for (int l = 0; l < 32; l++)                 /* collectives this lane no longer blocks */
    if (g_waiting[warp] >> l & 1) try_resolve(warp, g_fibers[warp * 32 + l].mask);
  check_activemask(warp);
  switch_to_scheduler(f);
  abort();                                     /* an exited fiber is never resumed */
}

/* ---- one block ------------------------------------------------------------------ */
void describe_waiters(std::string &out) {
  char buf[160];
  for (int t = 0, n = g_nthreads; t < n;) {
    const Fiber &f = g_fibers[t];
    int e = t + 1;
    while (e < n && g_fibers[e].state == f.state && g_fibers[e].line == f.line &&
           g_fibers[e].kind == f.kind && g_fibers[e].mask == f.mask)
      e++;
    if (f.state == BARRIER)
      snprintf(buf, sizeof buf, "; threads %d..%d wait at __syncthreads (line %d)", t, e - 1, f.line);
    else if (f.state == COLLECTIVE)
      snprintf(buf, sizeof buf, "; threads %d..%d wait at %s (mask 0x%08x)", t, e - 1,
               kKindNames[f.kind], f.mask);
    else
      snprintf(buf, sizeof buf, "; threads %d..%d %s", t, e - 1,
               f.state == EXITED ? "exited" : "runnable");
    if (out.size() < 700) out += buf;
    t = e;
  }
}

/* All non-exited threads wait at a barrier: release them, or fail if they diverged. */
bool release_barrier() {
  int line = -1;
  for (Fiber &f : g_fibers) {
    if (f.state != BARRIER) continue;
    if (line < 0) line = f.line;
    else if (f.line != line) {
      std::string msg = block_text() + ": threads wait at different __syncthreads";
      describe_waiters(msg);
      set_error("%s", msg.c_str());
      return false;
    }
  }
  for (int i = 0, n = (int)g_fibers.size(); i < n; i++) {
    Fiber &f = g_fibers[g_reverse ? n - 1 - i : i];
    if (f.state == BARRIER) push_runnable(&f);
  }
  g_nbarrier = 0;
  g_epoch++;                                   /* a new barrier interval */
  return true;
}

/* The library's __shared__ arrays (one section, see hidetc_emu.h): weak, for libraries
 * that have none. */
extern "C" char __start_hidetc_shared[] __attribute__((weak, visibility("hidden")));
extern "C" char __stop_hidetc_shared[] __attribute__((weak, visibility("hidden")));

static long shared_offset(uintptr_t a) {
  return __start_hidetc_shared ? (long)(a - (uintptr_t)__start_hidetc_shared) : (long)a;
}

/* Shared memory's contents are undefined when a block starts (another block's, another
 * kernel's): poison them (all bits set: NaN in floats), so a read of memory no thread
 * of this block wrote shows in the results instead of passing on stale values. */
void poison_shared() {
  if (__start_hidetc_shared && __stop_hidetc_shared > __start_hidetc_shared)
    std::memset(__start_hidetc_shared, 0xff, (size_t)(__stop_hidetc_shared - __start_hidetc_shared));
}

bool run_block() {
  poison_shared();
  g_epoch = 1;
  if (hidetc_emu_checks) g_shadow.clear();
  unsigned bx = hidetc_emu_block_dim.x, by = hidetc_emu_block_dim.y;
  g_runq.clear();
  g_runq_head = 0;
  for (int i = 0; i < g_nthreads; i++) {
    int t = g_reverse ? g_nthreads - 1 - i : i;
    Fiber &f = g_fibers[t];
    f.thread_idx = uint3{t % bx, (t / bx) % by, t / (bx * by)};
    f.id = t;
    f.line = f.kind = -1;
    f.mask = 0;
    f.copies.clear();
    f.open_group = 0;
    f.stack = g_stacks[t];
    init_fiber(&f);
    push_runnable(&f);
  }
  std::fill(g_exited.begin(), g_exited.end(), 0u);
  std::fill(g_waiting.begin(), g_waiting.end(), 0u);
  std::fill(g_warp_sync.begin(), g_warp_sync.end(), 0u);
  g_nexited = g_nbarrier = 0;
  for (;;) {
    while (g_runq_head < g_runq.size()) {
      switch_to_fiber(&g_fibers[g_runq[g_runq_head++]]);
      if (g_failed) return false;
    }
    g_runq.clear();
    g_runq_head = 0;
    if (g_nexited == g_nthreads) return true;
    if (g_nbarrier > 0 && g_nbarrier + g_nexited == g_nthreads) {
      if (!release_barrier()) return false;
      continue;
    }
    std::string msg = block_text() + ": deadlock";
    describe_waiters(msg);
    set_error("%s", msg.c_str());
    return false;
  }
}

}  // namespace

/* ---- entry points used by the kernels (through hidetc_emu.h) -------------------------- */
void hidetc_emu_fail(const char *fmt, ...) {
  char buf[768];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  Fiber *f = cur();
  uint3 t = f->thread_idx;
  set_error("%s thread (%u, %u, %u): %s", block_text().c_str(), t.x, t.y, t.z, buf);
  switch_to_scheduler(f);
  abort();
}

void hidetc_emu_cp_async(void *dst, const void *src, int bytes, bool pred) {
  Fiber *f = cur();
  hidetc_emu_shared_pending(dst, bytes);
  PendingCopy copy{dst, {}, bytes, f->open_group};
  if (pred) std::memcpy(copy.data, src, (size_t)bytes);    /* else: zero fill */
  f->copies.push_back(copy);
  std::memset(dst, 0xff, (size_t)bytes);                   /* poison until it lands */
}

void hidetc_emu_cp_commit() { cur()->open_group++; }

static bool in_shared(uintptr_t a) {
  return __start_hidetc_shared && a >= (uintptr_t)__start_hidetc_shared &&
         a < (uintptr_t)__stop_hidetc_shared;
}

void hidetc_emu_shared_pending(const void *p, int bytes) {
  if (!hidetc_emu_checks || !in_shared((uintptr_t)p)) return;
  uintptr_t a = (uintptr_t)p & ~(uintptr_t)1, end = (uintptr_t)p + (uintptr_t)bytes;
  for (; a < end; a += 2) g_shadow[a].pending = true;
}

/* Another thread's access in the current barrier interval that nothing orders before
 * this one: from another warp, or from another lane of this warp with no warp-wide
 * synchronization since (lanes run independently since Volta: only __syncwarp or a
 * collective orders them). */
static bool unordered(int other, unsigned epoch, unsigned sync, int t) {
  if (other < 0 || other == t || epoch != g_epoch) return false;
  return other / 32 != t / 32 || sync == g_warp_sync[t / 32];
}

void hidetc_emu_shared_record(const void *p, int bytes, int write, const char *array,
                              int line) {
  if (!hidetc_emu_checks || !in_shared((uintptr_t)p)) return;
  Fiber *f = cur();
  int t = f->id, warp = t / 32;
  unsigned sync = g_warp_sync[warp];
  uintptr_t a = (uintptr_t)p & ~(uintptr_t)1, end = (uintptr_t)p + (uintptr_t)bytes;
  for (; a < end; a += 2) {
    Shadow &s = g_shadow[a];
    bool stored = unordered(s.writer, s.w_epoch, s.w_sync, t);
    if (write) {
      bool other_warps = s.r_epoch == g_epoch && (s.reader_warps & ~(1u << (warp % 32)));
      int reader = other_warps ? s.reader : -1;
      if (!other_warps && unordered(s.reader, s.r_epoch, s.r_sync, t)) reader = s.reader;
      if (stored || reader >= 0)
        hidetc_emu_fail("race on shared memory (byte %ld): thread %d stores %s (line %d) "
                        "where thread %d %s %s (line %d) in the same barrier interval%s",
                        shared_offset(a), t, array, line, stored ? s.writer : reader,
                        stored ? "stored" : "loaded", stored ? s.w_array : s.r_array,
                        stored ? s.w_line : s.r_line,
                        (stored ? s.writer : reader) / 32 == warp
                            ? " (same warp, no __syncwarp between)" : "");
      s.writer = t; s.w_epoch = g_epoch; s.w_line = line; s.w_array = array;
      s.w_sync = sync;
      s.written = true;
      s.pending = false;
    } else {
      if (s.pending)
        hidetc_emu_fail("thread %d loads %s (line %d) at shared byte %ld while a cp.async "
                        "to it is still in flight (no wait_group covers it yet)", t, array,
                        line, shared_offset(a));
      if (!s.written)
        hidetc_emu_fail("thread %d loads %s (line %d) at shared byte %ld, which no thread "
                        "of this block has stored: uninitialized shared memory", t, array,
                        line, shared_offset(a));
      if (stored)
        hidetc_emu_fail("race on shared memory (byte %ld): thread %d loads %s (line %d) "
                        "what thread %d stored to %s (line %d) in the same barrier "
                        "interval%s", shared_offset(a), t, array, line, s.writer, s.w_array,
                        s.w_line, s.writer / 32 == warp ? " (same warp, no __syncwarp between)"
                                                        : "");
      if (s.r_epoch != g_epoch) { s.r_epoch = g_epoch; s.reader_warps = 0; }
      s.reader_warps |= 1u << (warp % 32);
      s.reader = t; s.r_line = line; s.r_array = array; s.r_sync = sync;
    }
  }
}

/* Complete this thread's copies of every committed group but the `pending` newest. */
void hidetc_emu_cp_wait(int pending) {
  Fiber *f = cur();
  int done_below = f->open_group - pending;
  size_t kept = 0;
  for (PendingCopy &c : f->copies) {
    if (c.group < done_below) {
      hidetc_emu_shared_access(c.dst, c.bytes, 1, "cp.async destination", 0);
      std::memcpy(c.dst, c.data, (size_t)c.bytes);
    }
    else f->copies[kept++] = c;
  }
  f->copies.resize(kept);
}

void hidetc_emu_syncthreads(int line) {
  Fiber *f = cur();
  f->state = BARRIER;
  f->line = line;
  g_nbarrier++;
  check_activemask(f->id / 32);
  switch_to_scheduler(f);
}

void hidetc_emu_collective(int kind, unsigned mask, const void *in, int in_size, void *out,
                           int out_size) {
  Fiber *f = cur();
  int warp = f->id / 32, lane = f->id % 32;
  unsigned exist = existing_lanes(warp);
  if (kind == HIDETC_EMU_ACTIVEMASK) {
    f->kind = kind;
    f->mask = 0;
    f->state = COLLECTIVE;
    g_waiting[warp] |= 1u << lane;
    check_activemask(warp);
    if (f->state != RUNNABLE) switch_to_scheduler(f);
    std::memcpy(out, f->out, (size_t)out_size);
    return;
  }
  if (!(mask >> lane & 1))
    hidetc_emu_fail("%s with mask 0x%08x does not include the calling lane %d",
                    kKindNames[kind], mask, lane);
  if (kind >= HIDETC_EMU_LDMATRIX_X1 && (exist != 0xffffffffu || mask != 0xffffffffu))
    hidetc_emu_fail("%s needs all 32 lanes of the warp", kKindNames[kind]);
  f->kind = kind;
  f->mask = mask & exist;
  if (in_size) std::memcpy(f->in, in, (size_t)in_size);
  f->state = COLLECTIVE;
  g_waiting[warp] |= 1u << lane;
  if (!try_resolve(warp, f->mask)) {
    check_activemask(warp);
    switch_to_scheduler(f);
  }
  if (out_size) std::memcpy(out, f->out, (size_t)out_size);
}

/* ---- the library's C API -------------------------------------------------------------- */
extern "C" HIDETC_EMU_EXPORT const char *hidetc_emu_last_error(void) { return g_error.c_str(); }

extern "C" HIDETC_EMU_EXPORT unsigned long long hidetc_emu_switch_count(void) { return g_switches; }

/* Blocks run one after another, x fastest, and a block's runnable threads in thread
 * order; reversed, the last block runs first and threads start (and leave each barrier)
 * last to first -- what a GPU may do: a kernel's result must not depend on either. */
extern "C" HIDETC_EMU_EXPORT void hidetc_emu_set_order(int reverse) {
  g_reverse = reverse != 0;
}

/* Shared-memory race checks (hidetc_emu_shared_access) on or off for later launches. */
extern "C" HIDETC_EMU_EXPORT void hidetc_emu_set_race_checks(int on) {
  hidetc_emu_checks = on != 0;
}

extern "C" HIDETC_EMU_EXPORT void hidetc_emu_set_stack_size(size_t bytes) {
  size_t page = (size_t)sysconf(_SC_PAGESIZE);
  bytes = bytes < 16384 ? 16384 : bytes;
  bytes = (bytes + page - 1) / page * page;
  if (bytes != g_stack_size) {
    free_stacks();
    g_stack_size = bytes;
  }
}

static int launch(void (*entry)(void **), unsigned gx, unsigned gy, unsigned gz,
                  unsigned bx, unsigned by, unsigned bz, void **args) {
  g_failed = false;
  g_error.clear();
  unsigned long long threads = (unsigned long long)bx * by * bz;
  if (!gx || !gy || !gz || !threads || threads > 1024) {
    set_error("invalid launch configuration: grid (%u, %u, %u), block (%u, %u, %u) "
              "(1..1024 threads per block)", gx, gy, gz, bx, by, bz);
    return 1;
  }
  g_nthreads = (int)threads;
  if (!ensure_stacks(g_nthreads)) {
    set_error("cannot allocate %d fiber stacks of %zu bytes", g_nthreads, g_stack_size);
    return 1;
  }
  g_fibers.assign((size_t)g_nthreads, Fiber());
  g_exited.assign((size_t)(g_nthreads + 31) / 32, 0u);
  g_waiting.assign(g_exited.size(), 0u);
  g_warp_sync.assign(g_exited.size(), 0u);
  g_entry = entry;
  g_args = args;
  hidetc_emu_grid_dim = dim3{gx, gy, gz};
  hidetc_emu_block_dim = dim3{bx, by, bz};
  unsigned long long blocks = (unsigned long long)gx * gy * gz;
  for (unsigned long long i = 0; i < blocks; i++) {
    unsigned long long b = g_reverse ? blocks - 1 - i : i;   /* x fastest */
    hidetc_emu_block_idx = uint3{(unsigned)(b % gx), (unsigned)(b / gx % gy),
                                 (unsigned)(b / ((unsigned long long)gx * gy))};
    if (!run_block()) {
      hidetc_emu_current = nullptr;
      return 1;
    }
  }
  hidetc_emu_current = nullptr;
  return 0;
}

/* The stacks live for one launch: every loaded kernel library has its own emulator
 * state, and stacks kept across launches (two mappings each, guard page included)
 * would exhaust the process's map count (vm.max_map_count, 65530 by default) once a
 * few dozen libraries had run 1024-thread blocks. */
extern "C" HIDETC_EMU_EXPORT int hidetc_emu_launch(void (*entry)(void **), unsigned gx,
                                                   unsigned gy, unsigned gz, unsigned bx,
                                                   unsigned by, unsigned bz, void **args) {
  int status = launch(entry, gx, gy, gz, bx, by, bz, args);
  free_stacks();
  return status;
}
