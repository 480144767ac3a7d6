/* hidetc_emu_internal.h -- what the emulator's runtime files share (not for kernels).
 * hidetc_emu.cpp schedules fibers; hidetc_emu_resolve.cpp computes the results of the
 * warp collectives from the operands every participating lane deposited. */
#pragma once
#include "hidetc_emu.h"

#include <vector>

#if !defined(__x86_64__) || defined(HIDETC_EMU_UCONTEXT)
#define HIDETC_EMU_USE_UCONTEXT 1
#include <ucontext.h>
#endif

#pragma GCC visibility push(hidden)
namespace hidetc_emu {

enum State { RUNNABLE, BARRIER, COLLECTIVE, EXITED };

/* A cp.async in flight: its bytes (read at issue), where they go, its commit group. */
struct PendingCopy {
  void *dst;
  unsigned char data[16];
  int bytes, group;
};

struct Fiber : HidetcEmuIndex {
  std::vector<PendingCopy> copies;   /* this thread's cp.async in flight, in issue order */
  int open_group;                    /* the group the next cp.async joins (= committed) */
#ifdef HIDETC_EMU_USE_UCONTEXT
  ucontext_t ctx;
#else
  void *sp;
#endif
  int id, state, line, kind;
  unsigned mask;
  unsigned char in[HIDETC_EMU_SLOT_IN], out[HIDETC_EMU_SLOT_OUT];
  char *stack;
};

inline const char *const kKindNames[HIDETC_EMU_NUM_KINDS] = {
    "__syncwarp", "__shfl_sync", "__shfl_up_sync", "__shfl_down_sync", "__shfl_xor_sync",
    "__ballot_sync", "__any_sync", "__all_sync", "ldmatrix.x1", "ldmatrix.x2", "ldmatrix.x4",
    "ldmatrix.x1.trans", "ldmatrix.x2.trans", "ldmatrix.x4.trans", "mma.m16n8k16",
    "__activemask", "mma.m16n8k16.bf16", "mma.m16n8k32.s32"};

extern std::vector<Fiber> g_fibers;  /* the threads of the running block */

/* Compute every participant's `out` for a collective of `kind` in `warp`; `part` is the
 * participating lanes. ldmatrix and mma always involve the whole warp. */
void resolve_shfl(int kind, int warp, unsigned part);
void resolve_vote(int kind, int warp, unsigned part);
void resolve_ldmatrix(int kind, int warp);
void resolve_mma(int warp, bool bf16);
void resolve_mma_int8(int warp);

}  // namespace hidetc_emu
#pragma GCC visibility pop
