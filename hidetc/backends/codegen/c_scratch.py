"""The cpu kernels' scratch memory: a local buffer of at most STACK_ALLOC_LIMIT bytes
lives on the C stack, a bigger one (or one sized at run time) comes from the per-thread
scratch stack (`SCRATCH_SOURCE`, part of every cpu translation unit) -- the one place
that decides is `stack_bytes` --; and how much of that stack a kernel takes at most in
one call (`heap_scratch_bytes`: the manifest's per-thread scratch, what each thread
running kernels keeps)."""
from __future__ import annotations

import math
from typing import Optional

import numpy as np

from hidetc.tir.functor import collect
from hidetc.tir.ir import Buffer, Const, Function

STACK_ALLOC_LIMIT = 64 * 1024  # bytes; OpenMP worker threads often have small stacks


# Scratch buffers too big for the stack (`CPrinter._alloc`) come from a per-thread stack
# kept across calls: malloc'ing and freeing megabytes per call let glibc hand the memory
# back to the OS (trim / munmap), and every call paid the page faults again (a Winograd
# conv's 4.5 MB of scratch: 3x slower per call). Pushes and pops are LIFO (the printer
# frees a block's buffers in reverse order). The stack grows only while empty (at the
# first push of a call) to the most a thread has needed at once; a push that does not
# fit meanwhile falls back to malloc, and its pop to free. One stack per thread and
# shared library (weak, hidden: every kernel module of an artifact uses the same one).
# The memory stays with the thread (the OpenMP workers' too) while it lives and is freed
# when it ends (a thread-specific key's destructor, registered at the stack's first
# growth): a server whose request threads come and go -- each with its own OpenMP team
# -- does not leak a stack per thread. The key is made once per library
# (`hidetc_scratch_key_init`, which records whether pthread_key_create succeeded in
# `hidetc_scratch_keyed`); where it failed, no destructor is registered (the key's value
# is not ours: setting it would clobber another library's key) and a thread's stack is
# kept until the process exits. The library is never unloaded (ctypes and the runtime
# keep it mapped), so the destructor stays callable.
SCRATCH_SOURCE = """\
typedef struct { char *base; size_t cap, top, want; } hidetc_scratch_t;
__attribute__((weak, visibility("hidden"))) __thread hidetc_scratch_t hidetc_scratch;
__attribute__((weak, visibility("hidden"))) pthread_key_t hidetc_scratch_key;
__attribute__((weak, visibility("hidden"))) int hidetc_scratch_keyed;
__attribute__((weak, visibility("hidden"))) pthread_once_t hidetc_scratch_once = PTHREAD_ONCE_INIT;
static void hidetc_scratch_free(void *p) {
  hidetc_scratch_t *s = (hidetc_scratch_t *)p;
  free(s->base); s->base = NULL; s->cap = s->top = s->want = 0;
}
static void hidetc_scratch_key_init(void) {
  hidetc_scratch_keyed = pthread_key_create(&hidetc_scratch_key, hidetc_scratch_free) == 0;
}
static inline char *hidetc_scratch_push(size_t bytes) {
  hidetc_scratch_t *s = &hidetc_scratch;
  size_t need = (bytes + 63) & ~(size_t)63;
  if (s->top + need > s->want) s->want = s->top + need;
  if (s->top == 0 && s->cap < s->want) {
    if (s->base == NULL) {
      pthread_once(&hidetc_scratch_once, hidetc_scratch_key_init);
      if (hidetc_scratch_keyed) pthread_setspecific(hidetc_scratch_key, s);
    }
    free(s->base);
    s->base = (char *)malloc(s->want);
    s->cap = s->base ? s->want : 0;
  }
  if (s->base && s->top + need <= s->cap) { char *p = s->base + s->top; s->top += need; return p; }
  return (char *)malloc(bytes);
}
static inline void hidetc_scratch_pop(char *p) {
  hidetc_scratch_t *s = &hidetc_scratch;
  if (s->base && p >= s->base && p < s->base + s->cap) s->top = (size_t)(p - s->base);
  else free(p);
}
"""


def constant_bytes(buf: Buffer) -> Optional[int]:
    """The bytes of `buf` when its shape is constant, else None (sized at run time)."""
    dims = [d.value if isinstance(d, Const) else d for d in buf.shape]
    if not all(isinstance(d, (int, np.integer)) for d in dims):
        return None
    return math.prod(int(d) for d in dims) * np.dtype(buf.dtype).itemsize


def stack_bytes(buf: Buffer) -> Optional[int]:
    """The bytes of local buffer `buf` when it lives on the C stack (a constant size of
    at most STACK_ALLOC_LIMIT), else None: it comes from the thread's scratch stack.
    What `CPrinter._alloc` and `heap_scratch_bytes` both decide by."""
    size = constant_bytes(buf)
    return size if size is not None and size <= STACK_ALLOC_LIMIT else None


def heap_scratch_bytes(fn: Function) -> Optional[int]:
    """The bytes `fn` takes at most from a thread's scratch stack in one call: every
    local buffer not on the C stack (`stack_bytes`), as if all were live at once (a
    bound: the stack is LIFO); None where a buffer's size is only known at run time."""
    total = 0
    for buf in collect(fn).allocs:
        if buf.scope != "local" or stack_bytes(buf) is not None:
            continue
        size = constant_bytes(buf)
        if size is None:
            return None
        total += (size + 63 + 63) & ~63              # the push's alignment slack, rounded
    return total
