"""Symbolic dimensions: integer expressions of named sizes (`seq`, `batch`), used where a
shape rule would use an int.

A `SymDim` is a polynomial with integer coefficients over *atoms*: a symbol name, or the
floor quotient `(expr) // k` of an expression by a positive constant (what a strided
window or a ceil-division makes of a symbol). It is kept canonical (terms sorted, like
terms merged, zero terms dropped), so equal expressions are equal objects and hash
alike, and an expression that folds to a constant is returned as a plain int: shape code
sees ints wherever nothing is symbolic.

Arithmetic: `+`, `-`, `*` with ints and SymDims; `//` and `%` by a positive int (exact
when every coefficient divides), and `//` by an expression that divides every term
(`(b*s*768) // (b*s) == 768`, what Reshape's -1 needs). Anything else raises
`SymbolicError` naming the expression, which the importer turns into a one-line error
naming the node.

Decisions (what a shape rule asks): symbols are sizes in their ranges (`assume`; a
symbol with no range is any size >= 1), so an expression has bounds (`bounds`); `<`,
`<=`, `>`, `>=` and `bool()` answer where the bounds decide, for every size in the
ranges, and raise `SymbolicError` otherwise. `==` is structural: a symbolic expression
never equals an int, so broadcasting treats a symbolic dimension as a real one (a size
that happens to be 1 at run time computes the same values as a broadcast would) and a
shape that needs `seq == 768` is refused at compile time rather than assumed. `int()`
and `__index__` raise: a symbolic size never silently becomes a number. `evaluate`
substitutes sizes (what the runtime does); `parse` reads `str` back (the manifest's
form).
"""
from __future__ import annotations

import ast
import contextlib
import contextvars
import math
from dataclasses import dataclass
from typing import Callable, Mapping, Optional, Union

import numpy as np

from hidetc.errors import ShapeError


class SymbolicError(ShapeError):
    """A shape rule asked something of a symbolic size that has no single answer."""


@dataclass(frozen=True, order=True)
class Quot:
    """The atom `num // den` (floor; den > 1, num not a multiple of den)."""
    num: "SymDim"
    den: int

    def __str__(self) -> str:
        return f"(({self.num})//{self.den})"

    def key(self) -> tuple:
        return (1, str(self))


Atom = Union[str, Quot]
Monomial = tuple  # sorted tuple of atoms (with repeats for powers); () is the constant
Dim = Union[int, "SymDim"]


def _atom_key(atom: Atom) -> tuple:
    return (0, atom) if isinstance(atom, str) else atom.key()


def _mono_key(mono: Monomial) -> tuple:
    return (len(mono), tuple(_atom_key(a) for a in mono))


class SymDim:
    """A canonical integer polynomial over atoms (see the module docstring)."""
    __slots__ = ("terms", "_hash")

    def __init__(self, terms: tuple[tuple[Monomial, int], ...]):
        self.terms = terms
        self._hash = hash(terms)

    # ------------------------------------------------------------------ building

    @staticmethod
    def symbol(name: str) -> "SymDim":
        if not name:
            raise ValueError("a symbol needs a name")
        return SymDim((((name,), 1),))

    @staticmethod
    def _make(acc: Mapping[Monomial, int]) -> Dim:
        terms = tuple(sorted(((m, c) for m, c in acc.items() if c),
                             key=lambda t: _mono_key(t[0])))
        if not terms:
            return 0
        if len(terms) == 1 and terms[0][0] == ():
            return terms[0][1]
        return SymDim(terms)

    def _items(self) -> dict[Monomial, int]:
        return dict(self.terms)

    @property
    def symbols(self) -> frozenset[str]:
        """The symbol names the expression depends on."""
        found: set[str] = set()
        for mono, _ in self.terms:
            for atom in mono:
                found |= {atom} if isinstance(atom, str) else set(symbols_of(atom.num))
        return frozenset(found)

    # ---------------------------------------------------------------- arithmetic

    def __add__(self, other: Dim) -> Dim:
        if not _sizelike(other):
            return NotImplemented
        acc = self._items()
        for mono, coef in _terms(other):
            acc[mono] = acc.get(mono, 0) + coef
        return SymDim._make(acc)

    __radd__ = __add__

    def __neg__(self) -> Dim:
        return SymDim._make({m: -c for m, c in self.terms})

    def __sub__(self, other: Dim) -> Dim:
        if not _sizelike(other):
            return NotImplemented
        return self + (-as_dim(other))

    def __rsub__(self, other: Dim) -> Dim:
        if not _sizelike(other):
            return NotImplemented
        return as_dim(other) + (-self)

    def __mul__(self, other: Dim) -> Dim:
        if not _sizelike(other):
            return NotImplemented
        acc: dict[Monomial, int] = {}
        for m1, c1 in self.terms:
            for m2, c2 in _terms(other):
                mono = tuple(sorted(m1 + m2, key=_atom_key))
                acc[mono] = acc.get(mono, 0) + c1 * c2
        return SymDim._make(acc)

    __rmul__ = __mul__

    def __floordiv__(self, other: Dim) -> Dim:
        if not _sizelike(other):
            return NotImplemented
        if isinstance(other, SymDim):
            return self._divide_by(other)
        k = _positive(other, f"({self}) // {other}")
        if k == 1:
            return self
        if all(c % k == 0 for _, c in self.terms):
            return SymDim._make({m: c // k for m, c in self.terms})
        if all(c < 0 for m, c in self.terms if m):   # floor(-p / k) == -ceil(p / k)
            return -(((-self) + (k - 1)) // k)       # (a ceil-division stays one)
        # pull out the whole multiples of k: (k*a + r) // k == a + r // k
        whole = {m: c // k for m, c in self.terms}
        rest = SymDim._make({m: c % k for m, c in self.terms})
        return SymDim._make(whole) + (rest if isinstance(rest, int) and rest == 0 else
                                      rest // k if isinstance(rest, int) else
                                      SymDim((((Quot(rest, k),), 1),)))

    def __rfloordiv__(self, other: Dim) -> Dim:
        if isinstance(other, int) and other == 0:
            return 0
        raise SymbolicError(f"{other} // ({self}) depends on the size of a symbolic dimension")

    def __mod__(self, other: Dim) -> Dim:
        if not _sizelike(other):
            return NotImplemented
        if isinstance(other, SymDim):
            quotient = self._divide_by(other)
            return self - quotient * other
        k = _positive(other, f"({self}) % {other}")
        return self - (self // k) * k

    def __rmod__(self, other: Dim) -> Dim:
        raise SymbolicError(f"{other} % ({self}) depends on the size of a symbolic dimension")

    def __truediv__(self, other: Dim) -> Dim:
        result = self // other
        if (result * other) != self:
            raise SymbolicError(f"({self}) / {other} is not an integer at every size")
        return result

    def __rtruediv__(self, other: Dim) -> Dim:
        raise SymbolicError(f"{other} / ({self}) depends on the size of a symbolic dimension")

    def _divide_by(self, other: "SymDim") -> Dim:
        """self // other where one term of `other` divides every term of self and the
        quotient times other is self (an exact division), else SymbolicError."""
        if len(other.terms) == 1:
            mono, coef = other.terms[0]
            acc: dict[Monomial, int] = {}
            for m, c in self.terms:
                left = list(m)
                for atom in mono:
                    if atom not in left:
                        break
                    left.remove(atom)
                else:
                    if c % coef == 0:
                        acc[tuple(left)] = c // coef
                        continue
                break
            else:
                return SymDim._make(acc)
        raise SymbolicError(f"({self}) // ({other}) is not one expression at every size")

    # ----------------------------------------------------------------- decisions

    def bounds(self) -> tuple[float, float]:
        """(least, greatest) over the symbols' ranges (`assume`; a symbol with none is
        any size >= 1), by interval arithmetic: exact for sums of positive monomials,
        conservative otherwise (never narrower than the true range)."""
        low = high = 0.0
        for mono, coef in self.terms:
            t_low = t_high = float(coef)
            for atom in mono:
                a_low, a_high = _atom_bounds(atom)
                corners = (t_low * a_low, t_low * a_high, t_high * a_low, t_high * a_high)
                corners = tuple(0.0 if math.isnan(c) else c for c in corners)
                t_low, t_high = min(corners), max(corners)
            low, high = low + t_low, high + t_high
        return low, high

    def lower_bound(self) -> int:
        """The least value over the symbols' ranges (`bounds`); SymbolicError where
        that is not bounded."""
        low = self.bounds()[0]
        if math.isinf(low):
            raise SymbolicError(f"the sign of {self} depends on the sizes")
        return int(math.floor(low))

    def _compare(self, other: Dim, op: str) -> bool:
        diff = self - as_dim(other)
        if isinstance(diff, int):
            return {"<": diff < 0, "<=": diff <= 0, ">": diff > 0, ">=": diff >= 0}[op]
        low, high = diff.bounds()
        decided = {">": (low > 0, high <= 0), ">=": (low >= 0, high < 0),
                   "<": (high < 0, low >= 0), "<=": (high <= 0, low > 0)}[op]
        if decided[0]:
            return True
        if decided[1]:
            return False
        decide = DECIDER.get()
        if decide is not None:
            return decide(diff, op)
        raise SymbolicError(f"whether {self} {op} {other} depends on the sizes "
                            f"({_ranges_text(diff)})")

    def __lt__(self, other: Dim) -> bool: return self._compare(other, "<")
    def __le__(self, other: Dim) -> bool: return self._compare(other, "<=")
    def __gt__(self, other: Dim) -> bool: return self._compare(other, ">")
    def __ge__(self, other: Dim) -> bool: return self._compare(other, ">=")

    def __bool__(self) -> bool:
        return self._compare(0, ">")

    def __eq__(self, other: object) -> bool:
        return isinstance(other, SymDim) and self.terms == other.terms

    def __ne__(self, other: object) -> bool:
        return not self == other

    def __hash__(self) -> int:
        return self._hash

    def __int__(self) -> int:
        raise SymbolicError(f"the size {self} is symbolic, not a number")

    __index__ = __int__

    def __float__(self) -> float:
        raise SymbolicError(f"the size {self} is symbolic, not a number")

    # ----------------------------------------------------------------- reading

    def evaluate(self, sizes: Mapping[str, int]) -> int:
        """The value with every symbol at `sizes` (KeyError for a missing one); sizes
        given as numpy int64 arrays give the values at every point at once."""
        total = 0
        for mono, coef in self.terms:
            total += coef * math.prod(_atom_value(a, sizes) for a in mono)
        return total

    def __str__(self) -> str:
        parts = []
        for mono, coef in self.terms:
            body = "*".join(a if isinstance(a, str) else str(a) for a in mono)
            if not mono:
                text = str(abs(coef))
            elif abs(coef) == 1:
                text = body
            else:
                text = f"{abs(coef)}*{body}"
            sign = "-" if coef < 0 else "+"
            parts.append(text if not parts and sign == "+" else
                         f"-{text}" if not parts else f" {sign} {text}")
        return "".join(parts)

    def __repr__(self) -> str:     # (messages print lists of sizes: the expression)
        return str(self)


def _sizelike(value: object) -> bool:
    return isinstance(value, (int, SymDim, np.integer)) and not isinstance(value, bool)


def as_dim(value: object) -> Dim:
    """An int or SymDim from an int-like (numpy ints included)."""
    if isinstance(value, SymDim):
        return value
    if isinstance(value, bool):
        raise TypeError("a size is not a bool")
    return int(value)  # type: ignore[arg-type]


def samples(ranges: Mapping[str, object]) -> list[dict[str, int]]:
    """A few size bindings over the symbols' ranges (name -> object with `lo`, `hi`):
    all at their minimum, at 2, at a prime inside, at their maximum (clamped into each
    range; duplicates dropped). What a pass checks by simulating at sizes holds where
    it holds at each of these, the ends and the degenerate size included."""
    def prime_in(lo: int, hi: int) -> int:
        for n in range(max(lo, (lo + hi) // 2 + 1), hi + 1):
            if n > 1 and all(n % d for d in range(2, int(n ** 0.5) + 1)):
                return n
        return hi
    picks = []
    for pick in ("lo", 2, "prime", "hi"):
        sizes = {}
        for name, r in ranges.items():
            lo, hi = r.lo, r.hi  # type: ignore[attr-defined]
            sizes[name] = (lo if pick == "lo" else hi if pick == "hi" else
                           min(max(2, lo), hi) if pick == 2 else prime_in(lo, hi))
        if sizes not in picks:
            picks.append(sizes)
    return picks


def shape_array(values) -> "np.ndarray":
    """Sizes as a shape value: int64, or an object array where one is symbolic (what the
    shape ops fold and Reshape / Expand / ... take as their shape input)."""
    values = list(values)
    if any(isinstance(v, SymDim) for v in values):
        return np.array(values, dtype=object)
    return np.array([int(v) for v in values], dtype=np.int64)


def symbols_of(value: object) -> frozenset[str]:
    return value.symbols if isinstance(value, SymDim) else frozenset()


def evaluate(value: Dim, sizes: Mapping[str, int]) -> int:
    """`value` with the symbols at `sizes` (an int stays itself)."""
    return value.evaluate(sizes) if isinstance(value, SymDim) else int(value)


def _terms(value: Dim) -> tuple[tuple[Monomial, int], ...]:
    value = as_dim(value)
    return value.terms if isinstance(value, SymDim) else (((), value),) if value else ()


def _positive(value: Dim, what: str) -> int:
    value = as_dim(value)
    if isinstance(value, SymDim) or value <= 0:
        raise SymbolicError(f"{what}: only division by a positive number is kept symbolic")
    return value


_RANGES: contextvars.ContextVar[Mapping[str, tuple[int, int]]] = \
    contextvars.ContextVar("symbol_ranges", default={})


@contextlib.contextmanager
def assume(ranges: Mapping[str, object]):
    """Decide comparisons with these symbol ranges (name -> an object with `lo` and
    `hi`, or a (lo, hi) pair) inside the block, on top of any outer ones."""
    pairs = {name: (r.lo, r.hi) if hasattr(r, "lo") else tuple(r)  # type: ignore[union-attr]
             for name, r in ranges.items()}
    token = _RANGES.set({**_RANGES.get(), **pairs})
    try:
        yield
    finally:
        _RANGES.reset(token)


# Who decides a comparison the ranges leave open: nobody (SymbolicError), or the
# enclosing `guards.guarded` build, which decides it at its hint and records a guard.
DECIDER: contextvars.ContextVar[Optional[Callable[["SymDim", str], bool]]] = \
    contextvars.ContextVar("symbol_decider", default=None)


def upper_bound(value: Dim) -> int:
    """The most `value` can be over the symbols' ranges (`assume`): an int stays itself;
    what memory is planned at (a buffer sized for the largest size serves them all)."""
    if not isinstance(value, SymDim):
        return int(value)
    high = value.bounds()[1]
    if math.isinf(high):
        raise SymbolicError(f"the size {value} has no upper bound ({_ranges_text(value)})")
    return int(high)


def _ranges_text(value: "SymDim") -> str:
    known = _RANGES.get()
    return ", ".join(f"{n} in {known[n][0]}..{known[n][1]}" if n in known else f"{n} >= 1"
                     for n in sorted(value.symbols))


def _atom_bounds(atom: Atom) -> tuple[float, float]:
    if isinstance(atom, str):
        lo, hi = _RANGES.get().get(atom, (1, math.inf))
        return float(lo), float(hi)
    low, high = atom.num.bounds()
    return math.floor(low / atom.den), math.floor(high / atom.den) if not \
        math.isinf(high) else math.inf


def _atom_value(atom: Atom, sizes: Mapping[str, int]) -> int:
    if isinstance(atom, str):
        value = sizes[atom]
        return value if isinstance(value, np.ndarray) else int(value)  # (arrays: many)
    return atom.num.evaluate(sizes) // atom.den


def parse(text: str) -> Dim:
    """`str(dim)` back to the dim: integers, symbol names (identifiers), `+ - *` and
    `//` by an integer; SyntaxError / ValueError for anything else."""
    tree = ast.parse(text.strip(), mode="eval").body

    def walk(node: ast.AST) -> Dim:
        if isinstance(node, ast.Constant) and isinstance(node.value, int) \
                and not isinstance(node.value, bool):
            return node.value
        if isinstance(node, ast.Name):
            return SymDim.symbol(node.id)
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return -as_dim(walk(node.operand))
        if isinstance(node, ast.BinOp):
            a, b = walk(node.left), walk(node.right)
            if isinstance(node.op, ast.Add):
                return a + b
            if isinstance(node.op, ast.Sub):
                return a - b
            if isinstance(node.op, ast.Mult):
                return a * b
            if isinstance(node.op, ast.FloorDiv):
                return a // b
        raise ValueError(f"{text!r} is not a size expression")

    return walk(tree)
