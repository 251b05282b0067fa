"""Exactness where the arithmetic is exact, a stated bound where it is not.

A float32 accumulation (a GEMM, a sum) depends on its summation order, and
the order is the dot kernel's choice: XLA's own loops, YNNPACK, torch, a
blocked or a pairwise tree, with or without FMA. Everything else the
workbench computes (MX quantization, codes, scales, elementwise float32 and
bf16 math) is order-independent and is compared bit for bit. This module
turns that distinction into one check.

**The bound.** For a contraction of length K over float32 (or bfloat16)
operands a, b, every summation order gives a float32 result within

    |fl(Σ_k a_k b_k) − S| ≤ E = γ_K · Σ_k |a_k b_k| + (flush terms),
    γ_K = K·u / (1 − K·u),  u = 2**-24,

of the exact sum S (Higham, *Accuracy and Stability of Numerical
Algorithms*, §3.1: any order, any tree, with or without fused
multiply-adds). S and Σ|a_k b_k| are computed in float64 from the operands
(a float32 product is exact in float64; float64's own summation error is
added to E), and XLA's CPU flushes float32 subnormals, so E also holds
Σ|a_k b_k| over the terms with a subnormal factor and 2K·2**-126 for flushed
products and partial sums. The result lies in [lo, hi] = [S − E, S + E]
rounded outwards to float32.

**Exact sums.** Where every term a_k b_k is a multiple of 2**q (q ≥ −126)
and Σ_k |a_k b_k| ≤ 2**(24 + q), every partial sum in every order is a
float32: no rounding happens at all and E = 0. Sums of MX products (a few
significant bits times power-of-two scales) are often exact in this sense.

**Through the rest of the program.** :func:`certify` traces a function to a
jaxpr and evaluates it op by op, carrying for each value an interval
[lo, hi] per element (lo == hi: order-independent). An accumulation whose
operands are exact gets the interval above (operands that are themselves
intervals: a midpoint-radius bound on top). An elementwise op that is
monotone in each argument (add, sub, mul, div away from zero, convert —
bf16 rounding to nearest even —, the bit pattern trick of ties-away bf16
rounding: bitcast, add, mask the low bits, bitcast back, max, min,
comparisons, select, sqrt, …) maps a box of arguments into the interval
spanned by its corners, and moving ops (reshape, transpose, broadcast,
slice, …) move intervals along. A rounding is *decisive* where the whole
interval rounds to one value: there the interval collapses and everything
downstream is order-independent again. What no rule covers (MX quantization
of a block that holds an undecided element, for one) becomes *unknown*.

:func:`check` then asserts, element by element, for the compiled result
``got`` and the vector ``want`` made elsewhere (another library, another
program):

- order-independent elements: ``got == want`` bit for bit (as values);
- interval elements: both lie in [lo, hi]; for bf16-valued outputs (a bf16
  rounding the bound leaves undecided) they also differ by at most one bf16
  ulp, and such elements are at most ``max_undecided`` of the output;
- unknown elements: only where the caller allows them, within
  ``unknown_atol`` × max |want| — a stated tolerance, not a bound — and
  at most ``max_unknown_differ`` of them differing at all.

It assumes what the rest of the suite checks: elementwise float32 and bf16
operations are correctly rounded and the same in every program (XLA does
not reassociate them), and float32 dot products are exact products summed
in float32 in *some* order (true of XLA's dots, YNNPACK's, and the
AVX512-BF16/AMX bf16 dots with float32 accumulation).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.extend
import jax.numpy as jnp
import ml_dtypes
import numpy as np

U32 = 2.0**-24
U64 = 2.0**-53
TINY32 = 2.0**-126

# what the session's tests certified (tests/conftest.py prints it at the end of a run)
REPORT: list[dict] = []
DEBUG: list | None = None  # set to [] to list where unknown elements arise


def gamma(k: int, u: float = U32) -> float:
    """γ_K = K·u / (1 − K·u)."""
    return k * u / (1 - k * u)


def _down32(x):
    """The largest float32 ≤ x (float64 array)."""
    y = x.astype(np.float32)
    return np.where(y.astype(np.float64) > x, np.nextafter(y, np.float32(-np.inf)), y)


def _up32(x):
    y = x.astype(np.float32)
    return np.where(y.astype(np.float64) < x, np.nextafter(y, np.float32(np.inf)), y)


def accumulation_interval(s, radius, t, t_sub, k: int):
    """[lo, hi] (float32) around the float64 sum ``s``: ``radius`` from the
    operands' own intervals, γ_K·``t`` (t = Σ|a_k b_k|) for float32 rounding in
    any order, ``t_sub`` (terms with a subnormal factor) for flushing, float64's
    own error on s and t."""
    flush = np.where((t == 0) & (t_sub == 0), 0, 2 * k * TINY32)  # t == 0: an exact sum (see _exact_in_f32)
    e = gamma(k) * t * (1 + 4 * gamma(k, U64)) + t_sub + flush + radius * (1 + 4 * gamma(k, U64))
    e = e + 4 * gamma(k, U64) * t + np.where(t == 0, 0, np.abs(s) * 4 * U64)
    return _down32(s - e), _up32(s + e)


# --------------------------------------------------------------------------- values with intervals


@dataclasses.dataclass
class Val:
    """A value of the program: one realization ``v`` and, where the order of an
    accumulation may change it, elementwise bounds ``lo ≤ v ≤ hi`` (None:
    exact everywhere) and an ``unk`` mask of elements no rule bounds."""
    v: np.ndarray
    lo: np.ndarray | None = None
    hi: np.ndarray | None = None
    unk: np.ndarray | None = None

    @property
    def exact(self) -> bool:
        return self.lo is None and self.unk is None

    def ends(self):
        return (self.v, self.v) if self.lo is None else (self.lo, self.hi)

    def unk_mask(self):
        return np.zeros(np.shape(self.v), bool) if self.unk is None else self.unk


def _tidy(val: Val) -> Val:
    """Drop bounds that have collapsed (lo == hi bit for bit) and empty masks."""
    if val.unk is not None and not val.unk.any():
        val.unk = None
    if val.lo is not None:
        a, b = np.asarray(val.lo), np.asarray(val.hi)
        same = (a == b) | (np.isnan(a) & np.isnan(b)) if a.dtype.kind == "f" else (a == b)
        if a.dtype.kind == "f":
            same &= np.signbit(a) == np.signbit(b)
        if same.all():
            val.lo = val.hi = None
    return val


def _unknown(vout) -> Val:
    return Val(vout, unk=np.ones(np.shape(vout), bool))


def _bind(eqn, invals):
    with eqn.ctx.manager:
        out = eqn.primitive.bind(*invals, **eqn.primitive.get_bind_params(eqn.params))
    return list(out) if eqn.primitive.multiple_results else [out]


def _np(x):
    if jax.dtypes.issubdtype(getattr(x, "dtype", np.float32), jax.dtypes.prng_key):
        return x  # a typed PRNG key stays a JAX array (exact: it feeds only random bits)
    return np.asarray(x)


# elementwise ops monotone in each argument (for fixed others), so a box of
# arguments maps into the interval spanned by its corners
_MONOTONE = {"add", "add_any", "sub", "mul", "max", "min", "neg", "convert_element_type", "reduce_precision",
             "sqrt", "rsqrt", "cbrt", "exp", "exp2", "log", "log1p", "expm1", "tanh", "logistic", "erf", "atan",
             "floor", "ceil", "round", "sign", "lt", "le", "gt", "ge", "copy", "copy_p", "div",
             "bitcast_convert_type", "and", "shift_right_logical", "not", "integer_pow", "square", "abs",
             "is_finite", "ne", "eq", "select_n"}
# ops that only move elements: applied to both ends and to the unknown mask
_MOVING = {"reshape", "broadcast_in_dim", "squeeze", "expand_dims", "transpose", "slice", "concatenate", "rev",
           "pad", "dynamic_slice", "gather"}
_HIGHER = {"jit", "pjit", "closed_call", "core_call", "custom_jvp_call", "custom_vjp_call", "remat", "checkpoint",
           "custom_vjp_call_jaxpr"}
_ACCUMULATE = {"dot_general", "reduce_sum"}


def _sub_jaxpr(eqn):
    p = eqn.params
    for name in ("jaxpr", "call_jaxpr", "fun_jaxpr"):
        if name in p:
            j = p[name]
            return (j.jaxpr, j.consts) if hasattr(j, "consts") else (j, ())
    return None


def _high_ones(m) -> bool:
    """Whether every value of the unsigned mask ``m`` is 1…10…0 (x & m is then monotone)."""
    m = np.asarray(m).astype(np.uint64) & np.uint64(0xFFFFFFFF)
    inv = (~m) & np.uint64(0xFFFFFFFF)
    return bool(np.all((inv & (inv + np.uint64(1))) == 0))


def _corners(eqn, ins: list[Val]):
    """Evaluate a monotone elementwise op on every corner of its argument box."""
    idx = [i for i, a in enumerate(ins) if a.lo is not None]
    outs = []
    for bits in range(1 << len(idx)):
        args = [a.v for a in ins]
        for j, i in enumerate(idx):
            args[i] = ins[i].hi if bits >> j & 1 else ins[i].lo
        outs.append(_np(_bind(eqn, args)[0]))
    stack = np.stack(outs)
    if stack.dtype == np.bool_:
        return stack.min(0), stack.max(0), np.zeros(stack.shape[1:], bool)
    nan = np.isnan(stack).any(0) if stack.dtype.kind == "f" else np.zeros(stack.shape[1:], bool)
    return stack.min(0), stack.max(0), nan


def _crosses_sign(val: Val):
    lo, hi = val.ends()
    lo, hi = np.asarray(lo), np.asarray(hi)
    if lo.dtype.kind == "f":
        return np.signbit(lo) != np.signbit(hi)
    if lo.dtype.kind == "u":
        top = np.uint64(1) << np.uint64(lo.dtype.itemsize * 8 - 1)
        return (lo.astype(np.uint64) & top) != (hi.astype(np.uint64) & top)
    return (lo < 0) != (hi < 0)


def _broadcast_mask(ins, shape):
    m = np.zeros(shape, bool)
    for a in ins:
        if a.unk is not None:
            m |= np.broadcast_to(a.unk, shape)
    return m


def _elementwise(eqn, ins: list[Val], vout) -> Val:
    name = eqn.primitive.name
    shape = np.shape(vout)
    unk = _broadcast_mask(ins, shape)
    bad = np.zeros(shape, bool)
    if name == "and":
        live = [a for a in ins if a.lo is not None]
        if len(live) != 1 or not _high_ones(next(a.v for a in ins if a.lo is None)):
            return _unknown(vout)
    if name in ("ne", "eq") and eqn.invars[0] is eqn.invars[1]:  # isnan: x != x
        lo, hi = ins[0].ends()
        bad = np.broadcast_to(np.isnan(lo) | np.isnan(hi), shape).copy()
        return _tidy(Val(_np(vout), unk=unk | bad if (unk | bad).any() else None))
    if name in ("ne", "eq", "abs", "integer_pow", "square"):
        for a in ins:
            if a.lo is not None:
                bad |= np.broadcast_to((a.lo != a.hi) if name in ("ne", "eq") else _crosses_sign(a), shape)
    if name == "div" and ins[1].lo is not None:
        lo, hi = ins[1].ends()
        bad |= np.broadcast_to(_crosses_sign(ins[1]) | (lo == 0) | (hi == 0), shape)
    if name == "bitcast_convert_type":
        bad |= np.broadcast_to(_crosses_sign(ins[0]), shape)
    if name == "select_n" and ins[0].lo is not None:
        bad |= np.broadcast_to(ins[0].lo != ins[0].hi, shape)
        ins = [Val(ins[0].v, unk=ins[0].unk)] + ins[1:]
    if name == "shift_right_logical":
        if ins[1].lo is not None:
            return _unknown(vout)
        bad |= np.broadcast_to(_crosses_sign(ins[0]), shape) if np.asarray(ins[0].v).dtype.kind == "i" else False
    lo, hi, nan = _corners(eqn, ins)
    bad |= nan & (lo != hi)
    unk |= bad
    return _tidy(Val(_np(vout), np.asarray(lo), np.asarray(hi), unk if unk.any() else None))


def _moving(eqn, ins: list[Val], vout) -> Val:
    nonarray = {"dynamic_slice": 1, "gather": 1}  # index operands: must be exact
    if any(a.lo is not None or a.unk is not None for a in ins[nonarray.get(eqn.primitive.name, len(ins)):]):
        return _unknown(vout)
    lo = _np(_bind(eqn, [a.ends()[0] for a in ins])[0])
    hi = _np(_bind(eqn, [a.ends()[1] for a in ins])[0])
    unk = None
    if any(a.unk is not None for a in ins):
        if eqn.primitive.name in nonarray:
            unk = _np(_bind(eqn, [ins[0].unk_mask().astype(np.uint8), *[a.v for a in ins[1:]]])[0]) > 0
        else:
            unk = _np(_bind(eqn, [a.unk_mask().astype(np.uint8) for a in ins])[0]) > 0
    return _tidy(Val(_np(vout), lo, hi, unk))


def _dims(eqn, a, b):
    (ca, cb), (ba, bb) = eqn.params["dimension_numbers"]
    fa = [i for i in range(a.ndim) if i not in ca and i not in ba]
    fb = [i for i in range(b.ndim) if i not in cb and i not in bb]
    return list(ca), list(cb), list(ba), list(bb), fa, fb


def _dot64(eqn, a, b):
    """dot_general in float64 with numpy (batch, a-free, b-free layout, as XLA)."""
    ca, cb, ba, bb, fa, fb = _dims(eqn, a, b)
    at = np.transpose(a, ba + fa + ca)
    bt = np.transpose(b, bb + cb + fb)
    nb = int(np.prod([a.shape[i] for i in ba], dtype=np.int64))
    k = int(np.prod([a.shape[i] for i in ca], dtype=np.int64))
    m = int(np.prod([a.shape[i] for i in fa], dtype=np.int64))
    n = int(np.prod([b.shape[i] for i in fb], dtype=np.int64))
    out = np.matmul(at.reshape(nb, m, k), bt.reshape(nb, k, n))
    return out.reshape([a.shape[i] for i in ba] + [a.shape[i] for i in fa] + [b.shape[i] for i in fb]), k


def _f64(x):
    return np.asarray(x).astype(np.float64)


def _mid_rad(val: Val):
    lo, hi = (_f64(e) for e in val.ends())
    return (lo + hi) / 2, (hi - lo) / 2


def _accumulate(eqn, ins: list[Val], vout) -> Val:
    vout = _np(vout)
    if vout.dtype != np.float32 or not all(jnp.issubdtype(np.asarray(a.v).dtype, jnp.floating) for a in ins):
        if all(a.exact for a in ins) and vout.dtype.kind in "iub":
            return Val(vout)
        return _unknown(vout)
    name = eqn.primitive.name
    if name == "dot_general":
        (ma, ra), (mb, rb) = _mid_rad(ins[0]), _mid_rad(ins[1])
        s, k = _dot64(eqn, ma, mb)
        t, _ = _dot64(eqn, np.abs(ma) + ra, np.abs(mb) + rb)
        radius = _dot64(eqn, np.abs(ma), rb)[0] + _dot64(eqn, ra, np.abs(mb))[0] + _dot64(eqn, ra, rb)[0]
        sub_a = np.where(np.abs(ma) + ra < TINY32, np.abs(ma) + ra, 0)
        sub_b = np.where(np.abs(mb) + rb < TINY32, np.abs(mb) + rb, 0)
        t_sub = _dot64(eqn, sub_a, np.abs(mb) + rb)[0] + _dot64(eqn, np.abs(ma) + ra, sub_b)[0]
        if ins[0].lo is None and ins[1].lo is None:  # exact operands: is the sum exact in any order?
            ea, eb = _low_exponent(ma), _low_exponent(mb)
            ca, cb, ba, bb, fa, fb = _dims(eqn, ma, mb)
            at = np.transpose(ea, ba + fa + ca).reshape(-1 if ba else 1, int(np.prod([ma.shape[i] for i in fa],
                dtype=np.int64)), k)
            bt = np.transpose(eb, bb + cb + fb).reshape(at.shape[0], k, -1)
            q = np.full((at.shape[0], at.shape[1], bt.shape[2]), np.inf)
            for c in range(0, k, 16):  # min-plus product in chunks
                q = np.minimum(q, (at[:, :, c:c + 16, None] + bt[:, None, c:c + 16, :]).min(axis=2))
            exact = _exact_in_f32(q.reshape(s.shape), t)
            t, t_sub, radius = np.where(exact, 0, t), np.where(exact, 0, t_sub), np.where(exact, 0, radius)
        unk = None
        if any(a.unk is not None for a in ins):
            unk = _dot64(eqn, ins[0].unk_mask().astype(np.float64), np.ones(np.shape(ins[1].v)))[0] \
                + _dot64(eqn, np.ones(np.shape(ins[0].v)), ins[1].unk_mask().astype(np.float64))[0] > 0
    else:
        axes = tuple(eqn.params["axes"])
        m, r = _mid_rad(ins[0])
        k = int(np.prod([m.shape[i] for i in axes], dtype=np.int64))
        s, radius, t = m.sum(axes), r.sum(axes), (np.abs(m) + r).sum(axes)
        t_sub = np.where(np.abs(m) + r < TINY32, np.abs(m) + r, 0).sum(axes)
        if ins[0].lo is None:
            exact = _exact_in_f32(_low_exponent(m).min(axes), t)
            t, t_sub = np.where(exact, 0, t), np.where(exact, 0, t_sub)
        unk = None if ins[0].unk is None else ins[0].unk.any(axes)
    lo, hi = accumulation_interval(s, radius, t, t_sub, max(k, 1))
    if unk is not None:
        lo, hi = np.where(unk, vout, lo), np.where(unk, vout, hi)
    return _tidy(Val(vout, lo, hi, unk))


def _low_exponent(x):
    """log2 of the largest power of two dividing each float64 ``x`` (+inf for 0)."""
    m, e = np.frexp(x)
    mi = np.abs(m * 2.0**53).astype(np.int64)
    low = mi & -mi
    tz = np.where(mi == 0, 0, np.log2(np.where(low == 0, 1, low)).round().astype(np.int64))
    return np.where(x == 0, np.inf, (e - 53 + tz).astype(np.float64))


def _exact_in_f32(q_exp, t):
    """Where every term is a multiple of 2**q_exp and Σ|terms| ≤ 2**(24 + q_exp),
    every partial sum in every order is a float32 (and no subnormal): the
    accumulation is exact whatever the order."""
    return np.isfinite(q_exp) & (q_exp >= -126) & (t <= np.exp2(np.minimum(24 + q_exp, 1000)))


def _contains_accumulation(jaxpr) -> bool:
    for eqn in jaxpr.eqns:
        if eqn.primitive.name in _ACCUMULATE:
            return True
        for p in eqn.params.values():
            for q in (p if isinstance(p, (tuple, list)) else (p,)):
                j = getattr(q, "jaxpr", q)
                if hasattr(j, "eqns") and _contains_accumulation(j):
                    return True
    return False


def _eval(jaxpr, consts, args: list[Val]) -> list[Val]:
    env = {}

    def read(x):
        if isinstance(x, jax.extend.core.Literal):
            return Val(_np(x.val))
        return env[x]

    for var, c in zip(jaxpr.constvars, consts):
        env[var] = Val(_np(c))
    for var, a in zip(jaxpr.invars, args):
        env[var] = a
    for eqn in jaxpr.eqns:
        ins = [read(x) for x in eqn.invars]
        name = eqn.primitive.name
        sub = _sub_jaxpr(eqn) if name in _HIGHER else None
        nested = [j for p in eqn.params.values() for q in (p if isinstance(p, (tuple, list)) else (p,))
                  for j in (getattr(q, "jaxpr", q),) if hasattr(j, "eqns")]
        if all(a.exact for a in ins) and name not in _ACCUMULATE and not any(map(_contains_accumulation, nested)):
            outs = [Val(_np(o)) for o in _bind(eqn, [a.v for a in ins])]  # nothing order-dependent in it
        elif sub is not None:
            outs = _eval(sub[0], sub[1], ins)
        elif name == "cond" and ins[0].exact:
            branches = eqn.params["branches"]
            br = branches[int(np.clip(ins[0].v, 0, len(branches) - 1))]
            outs = _eval(br.jaxpr, br.consts, ins[1:])
        elif nested:  # loops and the like: no rule
            outs = [_unknown(_np(o)) for o in _bind(eqn, [a.v for a in ins])]
        else:
            vouts = _bind(eqn, [a.v for a in ins])
            if name in _ACCUMULATE:
                outs = [_accumulate(eqn, ins, vouts[0])]
            elif name in _MONOTONE and len(vouts) == 1:
                outs = [_elementwise(eqn, ins, vouts[0])]
            elif name in _MOVING:
                outs = [_moving(eqn, ins, vouts[0])]
            elif name in ("reduce_max", "reduce_min"):
                lo = _np(_bind(eqn, [ins[0].ends()[0]])[0])
                hi = _np(_bind(eqn, [ins[0].ends()[1]])[0])
                unk = None if ins[0].unk is None else ins[0].unk.any(tuple(eqn.params["axes"]))
                outs = [_tidy(Val(_np(vouts[0]), lo, hi, unk))]
            else:
                outs = [_unknown(_np(o)) for o in vouts]
        if DEBUG is not None and name in _ACCUMULATE:
            DEBUG.append(("ACC", name, [np.shape(a.v) for a in ins], [a.exact for a in ins],
                          [0 if o.lo is None else int((o.lo != o.hi).sum()) for o in outs]))
        if DEBUG is not None and all(a.unk is None for a in ins):
            for o in outs:
                if o.unk is not None:
                    DEBUG.append((name, int(o.unk.sum()), [(a.lo is not None) for a in ins], str(eqn)[:300]))
        for var, o in zip(eqn.outvars, outs):
            env[var] = o
    return [read(x) for x in jaxpr.outvars]


@dataclasses.dataclass
class Certificate:
    """Per output of a function: a realization and the bounds every order obeys."""
    vals: list[Val]
    treedef: object

    def __getitem__(self, i) -> Val:
        return self.vals[i]


def certify(fn, *args) -> Certificate:
    """Evaluate ``fn(*args)`` op by op with the bounds above (see the module
    docstring); outputs in flattened order."""
    closed = jax.make_jaxpr(fn)(*args)
    flat = jax.tree.leaves(args)
    vals = _eval(closed.jaxpr, closed.consts, [Val(_np(a)) for a in flat])
    return Certificate(vals, jax.tree.structure(jax.eval_shape(fn, *args)))


# --------------------------------------------------------------------------- assertions


def bf16_ulps_apart(x, y):
    """How many bf16 steps separate bf16-valued float32 arrays ``x`` and ``y``."""
    def ordinal(v):  # monotone integer index of the bf16 values (±0 → 0)
        b = np.asarray(v, np.float32).view(np.uint32).astype(np.int64) >> 16
        return np.where(b & 0x8000, -(b & 0x7FFF), b)
    return np.abs(ordinal(x) - ordinal(y))


def check(got, want, val: Val, name: str, *, bf16: bool = False, max_undecided: float = 0.10,
          unknown_atol: float | None = None, max_unknown_differ: float = 0.05) -> dict:
    """Assert ``got`` (this program) and ``want`` (a vector made elsewhere)
    against the bounds of ``val`` (see the module docstring). Returns (and
    records in ``REPORT``) the element counts: exact (order-independent),
    undecided (within a summation-order interval), unknown (no bound), and
    how many of the latter two differ.

    ``bf16``: the outputs are bf16-rounded; undecided elements may differ by
    one bf16 ulp at most and be at most ``max_undecided`` of the elements.
    ``unknown_atol``: elements no rule bounds (an undecided rounding went on
    into an MX quantizer, say) are allowed only with it, as a stated
    tolerance relative to max |want| — not a bound — and at most
    ``max_unknown_differ`` of them may differ at all.
    """
    got, want = np.asarray(got), np.asarray(want)
    assert got.shape == want.shape == np.shape(val.v), (name, got.shape, want.shape, np.shape(val.v))
    unk = val.unk_mask()
    lo, hi = val.ends()
    lo, hi = np.asarray(lo, np.float32), np.asarray(hi, np.float32)
    interval = ~unk & ~((lo == hi) & (np.signbit(lo) == np.signbit(hi)))
    exact = ~unk & ~interval
    differ = ~((got == want) | (np.isnan(got) & np.isnan(want)))
    stats = {"name": name, "size": got.size, "exact": int(exact.sum()), "undecided": int(interval.sum()),
             "unknown": int(unk.sum()), "undecided_differ": int((interval & differ).sum()),
             "unknown_differ": int((unk & differ).sum()), "bf16": bf16}
    REPORT.append(stats)
    for label, arr in (("this program", got), ("the vector", want)):
        bad = exact & ~((arr == lo) | (np.isnan(arr) & np.isnan(lo)))
        assert not bad.any(), (f"{name}: {label} differs from the order-independent value in {bad.sum()} of "
                               f"{exact.sum()} elements, e.g. at {np.argwhere(bad)[0]}: {arr[bad][0]!r} vs "
                               f"{lo[bad][0]!r}")
        out = interval & ~((arr >= lo) & (arr <= hi))
        assert not out.any(), (f"{name}: {label} leaves the float32 summation-order bound in {out.sum()} elements, "
                               f"e.g. {arr[out][0]!r} not in [{lo[out][0]!r}, {hi[out][0]!r}]")
        if bf16:
            assert np.array_equal(arr, arr.astype(ml_dtypes.bfloat16).astype(np.float32), equal_nan=True), \
                f"{name}: {label} is not bf16-valued"
    if bf16 and interval.any():
        apart = bf16_ulps_apart(got[interval], want[interval])
        assert apart.max() <= 1, f"{name}: an undecided rounding differs by {apart.max()} bf16 ulps (more than one)"
        frac = interval.sum() / got.size
        assert frac <= max_undecided, f"{name}: {frac:.1%} of the bf16 roundings are undecided (> {max_undecided:.0%})"
    if unk.any():
        assert unknown_atol is not None, (f"{name}: {unk.sum()} elements have no bound (an undecided rounding "
                                          "reached an op no rule covers)")
        scale = float(np.abs(want).max())
        np.testing.assert_allclose(got[unk], want[unk], rtol=0, atol=unknown_atol * scale, err_msg=name)
        frac = (unk & differ).sum() / unk.sum()
        assert frac <= max_unknown_differ, f"{name}: {frac:.1%} of the unbounded elements differ"
    return stats


def summary(report=None) -> str:
    """One line over ``REPORT``: how many compared elements were exact, undecided, unknown."""
    rep = REPORT if report is None else report
    if not rep:
        return ""
    tot = {k: sum(r[k] for r in rep) for k in ("size", "exact", "undecided", "unknown", "undecided_differ",
                                              "unknown_differ")}
    bf = [r for r in rep if r["bf16"]]
    bf_size, bf_und = sum(r["size"] for r in bf), sum(r["undecided"] for r in bf)
    return (f"exactness: {len(rep)} outputs, {tot['size']} elements: {tot['exact']} order-independent (bit for bit), "
            f"{tot['undecided']} within a float32 summation-order bound ({tot['undecided_differ']} differ), "
            f"{tot['unknown']} unbounded ({tot['unknown_differ']} differ); bf16-rounded outputs: "
            f"{bf_und} of {bf_size} roundings undecided ({bf_und / max(bf_size, 1):.2%})")
