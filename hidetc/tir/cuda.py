"""Typed constructors for the CUDA intrinsics kernel templates use.

Each returns the IR the CUDA printer (`hidetc.backends.codegen.cuda`) and the device header
(`codegen/cuda_include/hidetc_cuda.h`) agree on, so templates never spell a raw
`Call("hidetc_...")`:

- warp shuffles and votes (`shfl`, `shfl_up`, `shfl_down`, `shfl_xor`, `ballot`,
  `any_sync`, `all_sync`) are Exprs WITHOUT the mask operand: the printer passes the
  full mask `0xffffffffu` (every lane of the warp must execute them);
- the copies and tensor-core helpers are Stmts (`Evaluate` of a void Call) whose
  address operands are buffer elements (`Load`s, printed as `&buf[i]`); operand 0 is
  always the destination:
    `copy(dst, src, nbytes)`               hidetc_copy{4,8,16}: one vector load + store
    `load_f4(dst, src)`                    hidetc_ld_f4: the same for 4 float32
    `cp_async(dst, src, nbytes, pred)`     hidetc_cp_async{4,8,16}: global -> shared,
                                           asynchronous; `pred` false zero-fills dst
    `cp_async_commit()`, `cp_async_wait(n)` (n pending groups may remain), `cp_async_wait_all()`
    `ldmatrix(dst, smem, count, trans)`    hidetc_ldmatrix_x{1,2,4}[_trans]: `count`
                                           8x8 b16 matrices from shared memory into
                                           `count` 32-bit registers dst[0..count); lane
                                           i gives the row address of row i%8 of
                                           matrix i//8
    `mma_m16n8k16(d, a, b, c=d, dtype)`    hidetc_mma_m16n8k16_{f16,bf16}f32: d = a @ b + c
                                           on the PTX fragments (a: 4, b: 2 32-bit
                                           registers of f16 or bf16 pairs, per `dtype`;
                                           c, d: 4 floats)
    `mma_m16n8k32(d, a, b, c=d, a_dtype, b_dtype)`  hidetc_mma_m16n8k32_<a><b>s32:
                                           d = a @ b + c on 8-bit integers (a: 4, b: 2
                                           32-bit registers of four uint8 / int8 each;
                                           c, d: 4 int32, sums wrapping modulo 2^32)
- pure register helpers (Exprs): `byte_perm(x, y, selector)` (hidetc_byte_perm: prmt's
  byte selection from {y, x}), `bytesum(x, acc, dtype)` (hidetc_bytesum_{u8,s8}: acc +
  the four bytes of x as uint8 / int8, dp4a);
- between blocks (split-K's partial sums): `threadfence()` (__threadfence: this
  thread's global writes are seen by every block before its later ones), `atomic_add(
  element, value)` (atomicAdd on a global or shared element: its old value),
  `load_cg(element)` (__ldcg: a global load cached in L2 only, so it sees what other
  blocks wrote after a fence, never a stale L1 line);
- `syncthreads()`, `thread_idx()`, `block_idx()` are re-exported from `hidetc.tir.ir`.

Assumes the operand rules of hidetc_cuda.h: vector copies, cp.async and ldmatrix rows
need their size in alignment (the emulator checks). Guarantees: a wrong operand kind,
scope, dtype or size raises ValueError here, at kernel-build time, not in nvcc.
"""
from __future__ import annotations

import numpy as np

from hidetc.tir.ir import (
    INDEX_DTYPE,
    Call,
    Cast,
    Const,
    Evaluate,
    Expr,
    ExprLike,
    Load,
    as_expr,
    block_idx,
    syncthreads,
    thread_idx,
)

__all__ = [
    "WARP_SIZE", "address_of", "all_sync", "any_sync", "atomic_add", "ballot", "block_idx",
    "copy", "cp_async", "cp_async_commit", "cp_async_wait", "cp_async_wait_all", "ldmatrix",
    "load_cg", "load_f4", "mma_m16n8k16", "shfl", "shfl_down", "shfl_up", "shfl_xor",
    "syncthreads", "thread_idx", "threadfence", "mma_m16n8k32", "byte_perm", "bytesum",
]

WARP_SIZE = 32
VECTOR_BYTES = (4, 8, 16)
MAX_WAIT_GROUPS = 7


# ---------------------------------------------------------------- warp shuffles, votes

def _index(v: ExprLike) -> Expr:
    e = as_expr(v)
    if e.dtype not in ("int32", "uint32"):
        raise ValueError(f"a lane/delta/width operand must be int32, got {e.dtype}")
    return e


def _shuffle(func: str, value: Expr, lane: ExprLike, width: int | None) -> Call:
    args: tuple[Expr, ...] = (value, _index(lane))
    if width is not None:
        if width not in (1, 2, 4, 8, 16, 32):
            raise ValueError(f"shuffle width must be a power of 2 up to 32, got {width}")
        # the printer requires the explicit mask when the optional width is given
        args = (Const(0xFFFFFFFF, "uint32"),) + args + (Const(width, INDEX_DTYPE),)
    return Call(func, args, value.dtype)


def shfl(value: Expr, src_lane: ExprLike, width: int | None = None) -> Call:
    """`__shfl_sync`: the value of `value` in lane `src_lane` (of the `width` segment)."""
    return _shuffle("__shfl_sync", value, src_lane, width)


def shfl_up(value: Expr, delta: ExprLike, width: int | None = None) -> Call:
    return _shuffle("__shfl_up_sync", value, delta, width)


def shfl_down(value: Expr, delta: ExprLike, width: int | None = None) -> Call:
    return _shuffle("__shfl_down_sync", value, delta, width)


def shfl_xor(value: Expr, lane_mask: ExprLike, width: int | None = None) -> Call:
    return _shuffle("__shfl_xor_sync", value, lane_mask, width)


def _bool(pred: ExprLike) -> Expr:
    e = as_expr(pred)
    if e.dtype != "bool":
        raise ValueError(f"a predicate must be bool, got {e.dtype}")
    return e


def ballot(pred: ExprLike) -> Call:
    return Call("__ballot_sync", (_bool(pred),), "uint32")


def any_sync(pred: ExprLike) -> Call:
    return Call("__any_sync", (_bool(pred),), "int32")


def all_sync(pred: ExprLike) -> Call:
    return Call("__all_sync", (_bool(pred),), "int32")


# ---------------------------------------------------------------- copies

def _element(op: Expr, what: str, scopes: tuple[str, ...]) -> Load:
    if not isinstance(op, Load):
        raise ValueError(f"{what} must be a buffer element (a Load), got {type(op).__name__}")
    if op.buffer.scope not in scopes:
        raise ValueError(f"{what}: buffer {op.buffer.name} has scope {op.buffer.scope!r}, "
                         f"want one of {scopes}")
    return op


def _void(func: str, *args: Expr) -> Evaluate:
    return Evaluate(Call(func, tuple(args), "void"))


def _nbytes(nbytes: int, what: str) -> int:
    if nbytes not in VECTOR_BYTES:
        raise ValueError(f"{what} copies 4, 8 or 16 bytes, got {nbytes}")
    return nbytes


def address_of(element: Expr) -> Call:
    """`&buf[i]` (a pointer of unknown use: the buffer counts as written)."""
    load = _element(element, "address_of operand", ("global", "shared", "local"))
    return Call("address_of", (load,), load.dtype)


def threadfence() -> Evaluate:
    """`__threadfence()`: this thread's global writes before it are visible to every
    thread of the grid before its writes after it."""
    return _void("__threadfence")


def atomic_add(element: Expr, value: ExprLike) -> Call:
    """`atomicAdd(&element, value)`: the element's old value (int32 or float32)."""
    load = _element(element, "atomicAdd operand", ("global", "shared"))
    if load.dtype not in ("int32", "uint32", "float32"):
        raise ValueError(f"atomicAdd takes int32, uint32 or float32, got {load.dtype}")
    return Call("atomicAdd", (load, as_expr(value, load)), load.dtype)


def load_cg(element: Expr) -> Call:
    """`__ldcg(&element)`: a global load cached in L2 only (not in this SM's L1), so a
    value another block wrote before its `threadfence` is read as written."""
    load = _element(element, "__ldcg operand", ("global",))
    return Call("__ldcg", (load,), load.dtype)


def copy(dst: Expr, src: Expr, nbytes: int) -> Evaluate:
    """`hidetc_copy{nbytes}(&dst, &src)`: one aligned vector load and store."""
    n = _nbytes(nbytes, "copy")
    scopes = ("global", "shared", "local")
    return _void(f"hidetc_copy{n}", _element(dst, "copy destination", scopes),
                 _element(src, "copy source", scopes))


def load_f4(dst: Expr, src: Expr) -> Evaluate:
    """`hidetc_ld_f4(&dst, &src)`: four float32 as one 16-byte-aligned `float4` load and
    store (the SIMT GEMM's fetch into registers)."""
    operands = [_element(op, what, ("global", "shared", "local"))
                for op, what in ((dst, "ld_f4 destination"), (src, "ld_f4 source"))]
    for op in operands:
        if op.dtype != "float32":
            raise ValueError(f"ld_f4 moves float32, got buffer {op.buffer.name} of {op.dtype}")
    return _void("hidetc_ld_f4", *operands)


def cp_async(dst: Expr, src: Expr, nbytes: int, pred: ExprLike = True) -> Evaluate:
    """`hidetc_cp_async{nbytes}(&dst, &src, pred)`: shared <- global, asynchronous; when
    `pred` is false nothing is read and `nbytes` zero bytes are written."""
    n = _nbytes(nbytes, "cp.async")
    return _void(f"hidetc_cp_async{n}", _element(dst, "cp.async destination", ("shared",)),
                 _element(src, "cp.async source", ("global",)), _bool(pred))


def cp_async_commit() -> Evaluate:
    return _void("hidetc_cp_async_commit")


def cp_async_wait(pending: int) -> Evaluate:
    """Wait until at most `pending` committed groups are still in flight."""
    if not isinstance(pending, int) or not 0 <= pending <= MAX_WAIT_GROUPS:
        raise ValueError(f"cp.async wait_group takes a constant 0..{MAX_WAIT_GROUPS}, "
                         f"got {pending!r}")
    return _void("hidetc_cp_async_wait_group", Const(pending, INDEX_DTYPE))


def cp_async_wait_all() -> Evaluate:
    return _void("hidetc_cp_async_wait_all")


# ---------------------------------------------------------------- tensor cores

def _registers(op: Expr, what: str, count: int, dtypes: tuple[str, ...]) -> Load:
    load = _element(op, what, ("local",))
    if load.dtype not in dtypes:
        raise ValueError(f"{what}: buffer {load.buffer.name} is {load.dtype}, want one of "
                         f"{dtypes}")
    shape = load.buffer.shape
    if all(isinstance(d, int) for d in shape):
        size = int(np.prod(shape)) * np.dtype(load.dtype).itemsize
        if size < 4 * count:
            raise ValueError(f"{what}: buffer {load.buffer.name} holds {size} bytes, "
                             f"needs at least {4 * count}")
    return load


def ldmatrix(dst: Expr, smem: Expr, count: int = 4, trans: bool = False) -> Evaluate:
    """`ldmatrix.sync.aligned.m8n8.x{count}[.trans].shared.b16`: every lane of the warp
    executes it; lane i (< 8 * count) gives in `smem` the 16-byte-aligned address of row
    i % 8 of matrix i // 8; register m of lane l gets (row l // 4, columns 2 * (l % 4)
    and +1) of matrix m (the transposed element pair with `trans`). A row is 16 bytes of
    16-bit elements, or of 8-bit ones read as byte pairs (the int8 tensor-core tiles)."""
    if count not in (1, 2, 4):
        raise ValueError(f"ldmatrix loads 1, 2 or 4 matrices, got {count}")
    regs = _registers(dst, "ldmatrix destination", count,
                      ("uint32", "int32", "float16", "bfloat16"))
    row = _element(smem, "ldmatrix source", ("shared",))
    if np.dtype(row.dtype).itemsize not in (1, 2):
        raise ValueError(f"ldmatrix reads 16-bit elements (or 8-bit pairs), "
                         f"{row.buffer.name} is {row.dtype}")
    return _void(f"hidetc_ldmatrix_x{count}{'_trans' if trans else ''}", regs, row)


# the operand type of mma.m16n8k16 -> its helper (f32 accumulation)
MMA_M16N8K16 = {"float16": "hidetc_mma_m16n8k16_f16f32",
                "bfloat16": "hidetc_mma_m16n8k16_bf16f32"}


def mma_m16n8k16(d: Expr, a: Expr, b: Expr, c: Expr | None = None,
                 dtype: str = "float16") -> Evaluate:
    """`mma.sync.aligned.m16n8k16.row.col.f32.<t>.<t>.f32` with t the operands' `dtype`
    (float16 or bfloat16; the fragment layouts are the same): d = a @ b + c (c defaults
    to d: accumulate in place). a: 4 registers (pairs of `dtype`), b: 2, c and d: 4
    floats."""
    if dtype not in MMA_M16N8K16:
        raise ValueError(f"mma.m16n8k16 takes float16 or bfloat16 operands, got {dtype!r}")
    c = d if c is None else c
    fd = _registers(d, "mma accumulator d", 4, ("float32",))
    fa = _registers(a, "mma operand a", 4, ("uint32", "int32", dtype))
    fb = _registers(b, "mma operand b", 2, ("uint32", "int32", dtype))
    fc = _registers(c, "mma accumulator c", 4, ("float32",))
    return _void(MMA_M16N8K16[dtype], fd, fa, fb, fc)


# the 8-bit operand types of mma.m16n8k32 -> their PTX names
INT8_OPERANDS = {"uint8": "u8", "int8": "s8"}
# (A type, B type) -> the helper of mma.m16n8k32 on them (int32 accumulation)
MMA_M16N8K32 = {(a, b): f"hidetc_mma_m16n8k32_{pa}{pb}s32"
                for a, pa in INT8_OPERANDS.items() for b, pb in INT8_OPERANDS.items()}


def mma_m16n8k32(d: Expr, a: Expr, b: Expr, c: Expr | None = None,
                 a_dtype: str = "int8", b_dtype: str = "int8") -> Evaluate:
    """`mma.sync.aligned.m16n8k32.row.col.s32.<ta>.<tb>.s32` with ta, tb the operands'
    8-bit types (uint8 or int8 each): d = a @ b + c (c defaults to d), the int32 sums
    wrapping modulo 2^32. a: 4 registers (A rows g, g + 8 at k 4t.. and 16 + 4t..), b: 2
    (B column g at k 4t.. and 16 + 4t..), four elements each, low byte first; c and d: 4
    int32 (the m16n8k16 C layout). g = lane // 4, t = lane % 4."""
    key = (a_dtype, b_dtype)
    if key not in MMA_M16N8K32:
        raise ValueError(f"mma.m16n8k32 takes uint8 or int8 operands, got {key}")
    c = d if c is None else c
    fd = _registers(d, "mma accumulator d", 4, ("int32",))
    fa = _registers(a, "mma operand a", 4, ("uint32", "int32"))
    fb = _registers(b, "mma operand b", 2, ("uint32", "int32"))
    fc = _registers(c, "mma accumulator c", 4, ("int32",))
    return _void(MMA_M16N8K32[key], fd, fa, fb, fc)


def _word(x: ExprLike, what: str) -> Expr:
    e = as_expr(x)
    if e.dtype not in ("uint32", "int32"):
        raise ValueError(f"{what} must be a 32-bit integer, got {e.dtype}")
    return e if e.dtype == "uint32" else Cast(e, "uint32")


def byte_perm(x: ExprLike, y: ExprLike, selector: int) -> Call:
    """`hidetc_byte_perm(x, y, selector)` (prmt, `__byte_perm`): byte n of the result is
    byte (selector >> 4n) & 7 of the eight bytes {y, x}, x's the low four."""
    if not isinstance(selector, int) or not 0 <= selector < 1 << 16:
        raise ValueError(f"a byte selector is a 16-bit constant, got {selector!r}")
    return Call("hidetc_byte_perm", (_word(x, "byte_perm operand"), _word(y, "byte_perm operand"),
                                     Const(selector, "uint32")), "uint32")


def bytesum(x: ExprLike, acc: ExprLike, dtype: str) -> Call:
    """`hidetc_bytesum_{u8,s8}(x, acc)`: acc + the four bytes of x read as `dtype` (uint8
    or int8; dp4a with ones), an int32 wrapping modulo 2^32."""
    if dtype not in INT8_OPERANDS:
        raise ValueError(f"bytesum reads uint8 or int8 bytes, got {dtype!r}")
    total = as_expr(acc)
    if total.dtype != "int32":
        raise ValueError(f"bytesum accumulates in int32, got {total.dtype}")
    return Call(f"hidetc_bytesum_{INT8_OPERANDS[dtype]}", (_word(x, "bytesum operand"), total),
                "int32")
