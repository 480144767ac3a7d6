"""RNN, GRU and LSTM read as their recurrences unrolled over the (static) sequence.

Assumes the ONNX forms of opsets 7..22 (RNN/GRU/LSTM-7, -14 added `layout`, -22 only
widened types): inputs X, W, R, B, sequence_lens, initial_h (LSTM: initial_c, P);
outputs Y, Y_h (LSTM: Y_c); gate orders W[zrh] (GRU), W[iofc] and P[iof] (LSTM).

Guarantees: the equations of the ONNX spec, step by step:
  - the input projections of every step are one MatMul, X [S, B, I] x W^T [I, G*H],
    plus the constant bias Wb + Rb of the gates that add it outside the recurrence;
  - each step t: Gather the step's projection, MatMul the previous hidden state with
    R^T, Slice the gates, apply the activations (`activations`, with
    `activation_alpha`/`activation_beta` consumed in order by the functions that take
    them; defaults RNN Tanh, GRU Sigmoid/Tanh, LSTM Sigmoid/Tanh/Tanh; per direction),
    `clip` bounding every gate's pre-activation;
  - GRU's `linear_before_reset` (r * (H R_h^T + Rb_h) instead of (r * H) R_h^T + Rb_h);
    LSTM's peepholes P (i and f see C_{t-1}, o sees C_t); `input_forget` is refused;
  - `direction` reverse runs the recurrence over the reversed sequence and reverses Y
    back; bidirectional stacks both on Y's direction axis;
  - `sequence_lens` (when given and not all equal to S): steps t >= len[b] keep the
    state and write zeros to Y; the reverse direction reverses each batch row within
    its own length (a GatherElements by len-1-t, an involution, applied before and
    after);
  - `layout` 1 (batch-major X, Y, initial and final states) by transposes around the
    seq-major recurrence.
Outputs nobody reads are not built. The graph grows with S (about 10 nodes per step and
direction); the fusion stage merges each step's elementwise gate math into few kernels.
"""
from __future__ import annotations

import numpy as np

from hidetc.errors import ModelError, UnsupportedOpError
from hidetc.frontend.onnx.base import Builder, Context, Converted, OnnxNode, label, scalar

GATES = {"RNN": 1, "GRU": 3, "LSTM": 4}
DEFAULT_ACTIVATIONS = {"RNN": ("Tanh",), "GRU": ("Sigmoid", "Tanh"),
                       "LSTM": ("Sigmoid", "Tanh", "Tanh")}
# activation -> (takes alpha, takes beta)
ACTIVATIONS = {"relu": (False, False), "tanh": (False, False), "sigmoid": (False, False),
               "softsign": (False, False), "softplus": (False, False),
               "leakyrelu": (True, False), "thresholdedrelu": (True, False),
               "elu": (True, False), "hardsigmoid": (True, True), "affine": (True, True),
               "scaledtanh": (True, True)}
_CATALOGUE = {"relu": "Relu", "tanh": "Tanh", "sigmoid": "Sigmoid", "softsign": "Softsign",
              "softplus": "Softplus", "leakyrelu": "LeakyRelu",
              "thresholdedrelu": "ThresholdedRelu", "elu": "Elu", "hardsigmoid": "HardSigmoid"}


def _i64(values) -> np.ndarray:
    return np.array(list(values), dtype=np.int64)


class _Activation:
    def __init__(self, name: str, alpha: float | None, beta: float | None):
        self.name, self.alpha, self.beta = name, alpha, beta

    def apply(self, build: Builder, x: str, dtype: str) -> str:
        key = self.name.lower()
        if key == "affine":
            scaled = build.add("Mul", [x, build.const("alpha", scalar(_or(self.alpha, 1.0),
                                                                      dtype))])
            return build.add("Add", [scaled, build.const("beta", scalar(_or(self.beta, 0.0),
                                                                        dtype))])
        if key == "scaledtanh":
            inner = build.add("Mul", [x, build.const("beta", scalar(_or(self.beta, 1.0), dtype))])
            return build.add("Mul", [build.add("Tanh", [inner]),
                                     build.const("alpha", scalar(_or(self.alpha, 1.0), dtype))])
        attrs = {}
        if self.alpha is not None:
            attrs["alpha"] = float(self.alpha)
        if self.beta is not None:
            attrs["beta"] = float(self.beta)
        return build.add(_CATALOGUE[key], [x], **attrs)


def _or(value: float | None, default: float) -> float:
    return default if value is None else float(value)


def _activations(node: OnnxNode, directions: int) -> list[list[_Activation]]:
    """Per direction, the op's activation functions (f, g[, h])."""
    per = len(DEFAULT_ACTIVATIONS[node.op])
    names = list(node.attrs.get("activations") or DEFAULT_ACTIVATIONS[node.op] * directions)
    if len(names) == per and directions == 2:
        names = names * 2
    if len(names) != per * directions:
        raise ModelError(f"{label(node)}: attribute 'activations' has {len(names)} "
                         f"function(s), expected {per * directions}")
    alphas = list(node.attrs.get("activation_alpha") or [])
    betas = list(node.attrs.get("activation_beta") or [])
    made = []
    for name in names:
        name = name.decode() if isinstance(name, bytes) else str(name)
        if name.lower() not in ACTIVATIONS:
            raise UnsupportedOpError(f"{label(node)}: activation '{name}' is not supported "
                                     f"(supported: {', '.join(sorted(ACTIVATIONS))})")
        takes_alpha, takes_beta = ACTIVATIONS[name.lower()]
        alpha = alphas.pop(0) if takes_alpha and alphas else None
        beta = betas.pop(0) if takes_beta and betas else None
        made.append(_Activation(name, alpha, beta))
    return [made[d * per:(d + 1) * per] for d in range(directions)]


class _Recurrence:
    """The builder state of one RNN/GRU/LSTM node."""

    def __init__(self, node: OnnxNode, ctx: Context):
        self.node, self.ctx = node, ctx
        self.build = Builder(node, ctx)
        self.op = node.op
        self.gates = GATES[node.op]
        x = ctx.types[node.inputs[0]]
        self.dtype = x.dtype
        if x.rank != 3:
            raise ModelError(f"{label(node)}: input X must have rank 3, got shape "
                             f"{list(x.shape)}")
        self.layout = int(node.attrs.get("layout", 0))
        if self.layout not in (0, 1):
            raise ModelError(f"{label(node)}: layout {self.layout} is not 0 or 1")
        w = ctx.types[node.inputs[1]]
        self.directions = w.shape[0] if w.rank == 3 else 0
        self.direction = node.attrs.get("direction", "forward")
        if isinstance(self.direction, bytes):
            self.direction = self.direction.decode()
        expected = 2 if self.direction == "bidirectional" else 1
        if self.direction not in ("forward", "reverse", "bidirectional"):
            raise ModelError(f"{label(node)}: direction '{self.direction}' is not forward, "
                             f"reverse or bidirectional")
        if self.directions != expected:
            raise ModelError(f"{label(node)}: W has shape {list(w.shape)}; direction "
                             f"'{self.direction}' expects {expected} direction(s) first")
        seq, batch, inputs = x.shape if self.layout == 0 else (x.shape[1], x.shape[0],
                                                               x.shape[2])
        self.seq, self.batch, self.input_size = seq, batch, inputs
        hidden = node.attrs.get("hidden_size")
        r = ctx.types[node.inputs[2]]
        self.hidden = int(hidden) if hidden is not None else r.shape[-1]
        g, h = self.gates, self.hidden
        self._expect(1, "W", (expected, g * h, inputs))
        self._expect(2, "R", (expected, g * h, h))
        self._expect(3, "B", (expected, 2 * g * h))
        self._expect(5, "initial_h", (expected, batch, h) if self.layout == 0
                     else (batch, expected, h))
        if self.op == "LSTM":
            self._expect(6, "initial_c", (expected, batch, h) if self.layout == 0
                         else (batch, expected, h))
            self._expect(7, "P", (expected, 3 * h))
            if int(node.attrs.get("input_forget", 0)):
                raise UnsupportedOpError(f"{label(node)}: input_forget=1 is not supported")
        self.acts = _activations(node, expected)
        clip = node.attrs.get("clip")
        self.clip = None if clip is None else float(clip)
        self.linear_before_reset = int(node.attrs.get("linear_before_reset", 0))
        self.lens = self._sequence_lens()

    def _expect(self, index: int, what: str, shape: tuple[int, ...]) -> None:
        name = self.node.input(index)
        if not name:
            return
        got = self.ctx.types[name]
        if tuple(got.shape) != tuple(shape):
            raise ModelError(f"{label(self.node)}: input {index} ({what}) has shape "
                             f"{list(got.shape)}, expected {list(shape)}")
        if got.dtype != self.dtype:
            raise ModelError(f"{label(self.node)}: input {index} ({what}) has dtype "
                             f"{got.dtype}, expected {self.dtype} (X's)")

    def _sequence_lens(self) -> str | None:
        """The sequence_lens input when it can shorten a row (None: every row is full)."""
        name = self.node.input(4)
        if not name:
            return None
        t = self.ctx.types[name]
        if tuple(t.shape) != (self.batch,) or t.dtype not in ("int32", "int64"):
            raise ModelError(f"{label(self.node)}: input 4 (sequence_lens) must be an int32 "
                             f"tensor of shape [{self.batch}], got {t.dtype} {list(t.shape)}")
        known = self.ctx.values.get(name)
        if known is not None:
            if np.any((known < 0) | (known > self.seq)):
                raise ModelError(f"{label(self.node)}: sequence_lens {known.tolist()} are not "
                                 f"all in [0, {self.seq}]")
            if np.all(known == self.seq):
                return None
        return self.build.add("Cast", [name], to="int64")

    # -- small builders --------------------------------------------------------------
    def const(self, what: str, value) -> str:
        return self.build.const(what, np.asarray(value))

    def slice(self, x: str, start: int, end: int, axis: int) -> str:
        return self.build.add("Slice", [x, self.const("starts", _i64([start])),
                                        self.const("ends", _i64([end])),
                                        self.const("axes", _i64([axis]))])

    def pick(self, x: str, index: int, axis: int = 0) -> str:
        return self.build.add("Gather", [x, self.const("index", np.array(index, np.int64))],
                              axis=axis)

    def unsqueeze(self, x: str, axis: int) -> str:
        return self.build.add("Unsqueeze", [x, self.const("axes", _i64([axis]))])

    def transpose(self, x: str, perm) -> str:
        return self.build.add("Transpose", [x], perm=tuple(perm))

    def activate(self, act: _Activation, x: str) -> str:
        if self.clip is not None:
            x = self.build.add("Clip", [x, self.const("low", scalar(-self.clip, self.dtype)),
                                        self.const("high", scalar(self.clip, self.dtype))])
        return act.apply(self.build, x, self.dtype)

    # -- the recurrence -------------------------------------------------------------
    def run(self) -> Converted:
        node, build = self.node, self.build
        x = node.inputs[0]
        if self.layout == 1:
            x = self.transpose(x, (1, 0, 2))
        states = {5: node.input(5), 6: node.input(6) if self.op == "LSTM" else ""}
        if self.layout == 1:
            states = {k: self.transpose(v, (1, 0, 2)) if v else v for k, v in states.items()}
        ys, hs, cs = [], [], []
        for d in range(self.directions):
            reverse = self.direction == "reverse" or d == 1
            y, h, c = self.direction_pass(x, d, reverse, states)
            ys.append(y)
            hs.append(h)
            cs.append(c)
        outs = list(node.outputs) + [""] * (3 - len(node.outputs))
        if outs[0]:
            y = ys[0] if len(ys) == 1 else build.add("Concat", ys, axis=1)
            self.finish(y, outs[0], (2, 0, 1, 3))
        if outs[1]:
            h = hs[0] if len(hs) == 1 else build.add("Concat", hs, axis=0)
            self.finish(h, outs[1], (1, 0, 2))
        if self.op == "LSTM" and outs[2]:
            c = cs[0] if len(cs) == 1 else build.add("Concat", cs, axis=0)
            self.finish(c, outs[2], (1, 0, 2))
        return build.done()

    def finish(self, value: str, out: str, perm) -> None:
        if self.layout == 1:
            self.build.add("Transpose", [value], out=out, perm=tuple(perm))
        else:
            self.build.add("Identity", [value], out=out)

    def reverse_index(self) -> str | None:
        """int64 [S, B] with len[b]-1-t where t < len[b], else t (None: plain flip)."""
        steps = self.const("steps", np.arange(self.seq, dtype=np.int64).reshape(self.seq, 1))
        flipped = self.build.add("Sub", [self.build.add("Sub", [self.lens, self.const(
            "one", np.array(1, np.int64))]), steps])
        inside = self.build.add("Less", [steps, self.lens])
        return self.build.add("Where", [inside, flipped, self.build.add(
            "Expand", [steps, self.const("shape", _i64([self.seq, self.batch]))])])

    def reorder(self, x: str, index: str | None, width: int) -> str:
        """x [S, B, width] reversed along S (per row within its length when masked)."""
        if index is None:
            flip = self.const("flip", np.arange(self.seq - 1, -1, -1, dtype=np.int64))
            return self.build.add("Gather", [x, flip], axis=0)
        wide = self.build.add("Expand", [self.unsqueeze(index, 2),
                                         self.const("shape", _i64([self.seq, self.batch,
                                                                   width]))])
        return self.build.add("GatherElements", [x, wide], axis=0)

    def direction_pass(self, x: str, d: int, reverse: bool, states: dict[int, str]
                       ) -> tuple[str, str, str]:
        node, build, g, hsz = self.node, self.build, self.gates, self.hidden
        index = self.reverse_index() if reverse and self.lens is not None else None
        if reverse:
            x = self.reorder(x, index, self.input_size)
        w_t = self.transpose(self.pick(node.inputs[1], d), (1, 0))      # [I, G*H]
        r_d = self.pick(node.inputs[2], d)                               # [G*H, H]
        if node.input(3):
            b = self.pick(node.input(3), d)
            wb, rb = self.slice(b, 0, g * hsz, 0), self.slice(b, g * hsz, 2 * g * hsz, 0)
        else:
            wb = rb = self.const("zero_bias", np.zeros(g * hsz, self.dtype))
        projected = build.add("MatMul", [x, w_t])                        # [S, B, G*H]
        if self.op == "GRU":
            # z and r take both biases outside; h takes Wb_h outside, Rb_h by the mode
            outside = build.add("Concat", [self.slice(build.add("Add", [wb, rb]), 0,
                                                      2 * hsz, 0),
                                           self.slice(wb, 2 * hsz, 3 * hsz, 0)], axis=0)
            rb_h = self.slice(rb, 2 * hsz, 3 * hsz, 0)
            r_zr = self.transpose(self.slice(r_d, 0, 2 * hsz, 0), (1, 0))
            r_h = self.transpose(self.slice(r_d, 2 * hsz, 3 * hsz, 0), (1, 0))
        else:
            outside = build.add("Add", [wb, rb])
            r_all = self.transpose(r_d, (1, 0))                         # [H, G*H]
        projected = build.add("Add", [projected, outside])
        h = self.initial(states[5], d)
        c = self.initial(states[6], d) if self.op == "LSTM" else ""
        if self.op == "LSTM" and node.input(7):
            p = self.pick(node.input(7), d)
            peep = [self.slice(p, k * hsz, (k + 1) * hsz, 0) for k in range(3)]
        else:
            peep = None
        acts = self.acts[d]
        steps = []
        for t in range(self.seq):
            xt = self.pick(projected, t)                                # [B, G*H]
            if self.op == "RNN":
                new_h = self.activate(acts[0], build.add("Add", [xt, build.add(
                    "MatMul", [h, r_all])]))
                new_c = ""
            elif self.op == "GRU":
                new_h, new_c = self.gru_step(xt, h, r_zr, r_h, rb_h, acts), ""
            else:
                new_h, new_c = self.lstm_step(xt, h, c, r_all, peep, acts)
            if self.lens is not None:
                keep = self.unsqueeze(build.add("Less", [self.const(
                    "t", np.array(t, np.int64)), self.lens]), 1)          # [B, 1]
                new_h = build.add("Where", [keep, new_h, h])
                if new_c:
                    new_c = build.add("Where", [keep, new_c, c])
                out_t = build.add("Where", [keep, new_h, self.const(
                    "zero", scalar(0.0, self.dtype))])
            else:
                out_t = new_h
            steps.append(self.unsqueeze(out_t, 0))
            h, c = new_h, new_c
        y = steps[0] if len(steps) == 1 else build.add("Concat", steps, axis=0)   # [S, B, H]
        if reverse:
            y = self.reorder(y, index, hsz)
        y = self.unsqueeze(y, 1)
        return y, self.unsqueeze(h, 0), (self.unsqueeze(c, 0) if c else "")

    def initial(self, state: str, d: int) -> str:
        if state:
            return self.pick(state, d)
        return self.const("zero_state", np.zeros((self.batch, self.hidden), self.dtype))

    def gru_step(self, xt: str, h: str, r_zr: str, r_h: str, rb_h: str, acts) -> str:
        build, hsz = self.build, self.hidden
        zr = build.add("Add", [self.slice(xt, 0, 2 * hsz, 1), build.add("MatMul", [h, r_zr])])
        z = self.activate(acts[0], self.slice(zr, 0, hsz, 1))
        r = self.activate(acts[0], self.slice(zr, hsz, 2 * hsz, 1))
        x_h = self.slice(xt, 2 * hsz, 3 * hsz, 1)
        if self.linear_before_reset:
            recurrent = build.add("Mul", [r, build.add("Add", [build.add("MatMul", [h, r_h]),
                                                              rb_h])])
        else:
            recurrent = build.add("Add", [build.add("MatMul", [build.add("Mul", [r, h]), r_h]),
                                          rb_h])
        candidate = self.activate(acts[1], build.add("Add", [x_h, recurrent]))
        one = self.const("one", scalar(1.0, self.dtype))
        return build.add("Add", [build.add("Mul", [build.add("Sub", [one, z]), candidate]),
                                 build.add("Mul", [z, h])])

    def lstm_step(self, xt: str, h: str, c: str, r_all: str, peep, acts) -> tuple[str, str]:
        build, hsz = self.build, self.hidden
        gates = build.add("Add", [xt, build.add("MatMul", [h, r_all])])
        i, o, f, cand = (self.slice(gates, k * hsz, (k + 1) * hsz, 1) for k in range(4))
        if peep is not None:
            i = build.add("Add", [i, build.add("Mul", [peep[0], c])])
            f = build.add("Add", [f, build.add("Mul", [peep[2], c])])
        i = self.activate(acts[0], i)
        f = self.activate(acts[0], f)
        cand = self.activate(acts[1], cand)
        new_c = build.add("Add", [build.add("Mul", [f, c]), build.add("Mul", [i, cand])])
        if peep is not None:
            o = build.add("Add", [o, build.add("Mul", [peep[1], new_c])])
        o = self.activate(acts[0], o)
        new_h = build.add("Mul", [o, self.activate(acts[2], new_c)])
        return new_h, new_c


def recurrent(node: OnnxNode, ctx: Context) -> Converted:
    if len(node.inputs) < 3 or not all(node.inputs[:3]):
        raise ModelError(f"{label(node)}: inputs X, W and R are required")
    return _Recurrence(node, ctx).run()


HANDLERS = {"RNN": recurrent, "GRU": recurrent, "LSTM": recurrent}
EXTRA_OPS: tuple[str, ...] = ("RNN", "GRU", "LSTM")
CHECKED: tuple[str, ...] = ("RNN", "GRU", "LSTM")
FIRST_VERSION: dict[str, int] = {}
