#!/usr/bin/env python
"""Reference test vectors from the two public PyTorch MX code bases.

What it generates (all float arrays float32; strings as numpy unicode arrays):

* ``mx_linear_upstream.npz`` -- microsoft/microxcaling (``--library upstream``):
  ``mx.linear.linear(x, w, b, mx_specs=...)`` (i.e. ``LinearFunction``) forward
  and backward for several MX recipes.  Keys ``<case>/<array>``.
* ``mx_layernorm_fork.npz`` -- the paper authors' fork of that library
  (``--library fork``): ``mx.layernorm.LayerNormFunction.apply`` forward and
  backward, with and without the fork's ``dont_quantize_layernorm`` flag.
* ``mx_bump_fork.npz`` -- also ``--library fork``: ``quantize_mx_op`` with
  the fork's ``bump_up_overflow_exponent`` off and on (E4M3).
* ``mx_student_fork.npz`` -- also ``--library fork``: one step of the authors'
  student/teacher proxy (``olmo/synthetic/student_teacher.py``): their
  ``ResidualMLP`` built before ``mx_mapping.inject_pyt_ops(make_mx_specs(args))``
  exactly as their ``mx_loop`` does, then loss/gradients on one batch and
  three Adam steps on three further batches.  Each MX recipe runs in its own
  child process (the injection patches ``torch`` globally and is not undone).

Sources (read-only clones; the commit of each is stored in every npz as the
string array ``commit``; ``torch_version`` likewise):

* upstream: https://github.com/microsoft/microxcaling at
  7bc41952de394f5cc5e782baf132e7c7542eb4e4 (``--src CLONES/microxcaling``)
* fork:     the authors' repo (systems-scaling) at
  8aa0ac8ada5a61276b7bc71b89e1872bb82b56e2, package ``olmo/mx`` and script
  ``olmo/synthetic/student_teacher.py`` (``--src CLONES/systems-scaling/olmo``)
  (``CLONES``: wherever the two repositories are cloned.)

The script imports the library from ``--src`` (it never copies its code); the
two libraries are both a package named ``mx``, so run one process per library.
Everything runs on CPU in float32 with ``torch.set_num_threads(1)``; inputs
come from numpy's ``default_rng`` with fixed seeds.  ``custom_cuda`` is off, so
all quantisation is the library's pure PyTorch path.  Gaussian widths are
standard deviations (``g ~ N(0, 1e-3)`` means std 1e-3).

Shapes: ``--profile compact`` (default) keeps each file under 400 KB by using
fewer rows (M / batch) than ``--profile brief`` and a student of width 32 (a
width-64 student's initial plus two final parameter sets alone exceed 400 KB);
the block-structure dimensions (K, N, D) are the same in both profiles.
``--profile brief`` reproduces the originally requested sizes (files of about
1.3-1.8 MB; not committed).  See the ``meta/*`` / ``config_json`` arrays in each file.

Rerun (from the repository root, with a venv holding torch==2.13.0 (CPU),
numpy, packaging and pyyaml -- the last two are imported by the libraries /
the authors' script):

    python tests/data/make_mx_library_vectors.py --library upstream \\
        --src CLONES/microxcaling --out tests/data
    python tests/data/make_mx_library_vectors.py --library fork \\
        --src CLONES/systems-scaling/olmo --out tests/data

Layout (torch orientation: Linear weights are (out_features, in_features) = (N, K)):

mx_linear_upstream.npz, per case: x (M,K), w (N,K), b (N,), g (M,N) upstream
  gradient, y (M,N), dx (M,K), dw (N,K), db (N,), specs_json (finalised specs).
mx_layernorm_fork.npz, per case: x (M,D), gain (D,), bias (D,), g (M,D), y, dx,
  dgain (D,), has_dbias (bool; the fork returns None for the bias gradient),
  [dbias only if not None], specs_json; eps () = 1e-5.  Note: in the fork's
  LayerNormFunction, dont_quantize_layernorm=True skips only the input/gain/bias
  quantisation, the mean/variance ops and the backward; x_var+eps, sqrt,
  reciprocal, x_norm, gain*x_norm and +bias are still rounded to bf16.
mx_student_fork.npz: init/<state_dict name>, batch0/x, batch0/y (B,d),
  steps/x, steps/y (3,B,d); per case <case>/out (B,d), <case>/loss (),
  <case>/grad/<param name> (zeros where the grad is None), <case>/none_grads,
  <case>/step_losses (3,), <case>/final/<param name>, <case>/autograd_nodes,
  <case>/gelu_is_torch, <case>/ln_bias_grad_none, <case>/specs_json.
"""

import argparse
import importlib
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import types

import numpy as np

sys.dont_write_bytecode = True  # leave the read-only source trees untouched

# MX element formats as defined in mx/formats.py:
# (stored mantissa bits, min normal exponent, emax, max_norm)
ELEM_FORMATS = {
    "fp8_e4m3": (3, -6, 8, 448.0),
    "fp8_e5m2": (2, -14, 15, 57344.0),
    "fp6_e2m3": (3, 0, 2, 7.5),
    "fp6_e3m2": (2, -2, 4, 28.0),
}

E4M3 = "fp8_e4m3"
E5M2 = "fp8_e5m2"
FP6 = "fp6_e2m3"

# (w, a, w_bp, a_bp_ex, a_bp_os); a_elem_format_bp is deliberately left unset.
FMT_MIXED = (E4M3, E4M3, E5M2, E5M2, E5M2)
FMT_E4M3 = (E4M3,) * 5
FMT_FP6 = (FP6,) * 5

PROFILES = {
    "compact": {
        "linear": {"mixed": [(32, 96, 64), (48, 80, 48), (32, 64, 160)],
                   "e4m3": [(24, 64, 32), (40, 48, 40)],
                   "fp6": [(32, 40, 48)], "fwdonly": [(32, 48, 32)], "even": [(32, 48, 32)]},
        "ln": [(64, 64), (32, 96)], "ln_g093": (32, 64),
        "student": {"width": 32, "depth": 2, "batch": 64},
    },
    "brief": {
        "linear": {"mixed": [(256, 96, 64), (128, 80, 48), (64, 64, 160)],
                   "e4m3": [(256, 96, 64), (128, 80, 48)],
                   "fp6": [(256, 96, 64)], "fwdonly": [(256, 96, 64)], "even": [(256, 96, 64)]},
        "ln": [(256, 64), (128, 96)], "ln_g093": (256, 64),
        "student": {"width": 64, "depth": 2, "batch": 256},
    },
}


# --------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------
def git_commit(path):
    try:
        top = subprocess.check_output(["git", "-C", path, "rev-parse", "HEAD"], text=True).strip()
        dirty = subprocess.check_output(["git", "-C", path, "status", "--porcelain", "--", "."],
                                        text=True).strip()
        return top + ("+dirty" if dirty else "")
    except Exception as e:  # pragma: no cover
        return f"unknown ({e})"


def sarr(*strings):
    return np.array(list(strings))


def bf16_ties(a):
    """Replace each value by the midpoint between two adjacent bfloat16 values
    (bf16 truncation plus half a bf16 ulp) -- an exact tie for bf16 rounding."""
    a = np.ascontiguousarray(a, dtype=np.float32)
    bits = a.view(np.uint32)
    return ((bits & np.uint32(0xFFFF0000)) | np.uint32(0x8000)).view(np.float32).copy()


def mx_tie_row(rng, length, fmt, scale_exp, block=32):
    """A row whose 32-blocks each contain 2**emax (so the shared exponent is
    exactly scale_exp) and otherwise only midpoints of the element grid of
    `fmt` (normal and subnormal), all times 2**scale_exp: exact ties for the
    MX element rounding (and exactly representable in bf16)."""
    mb, emin, emax, max_norm = ELEM_FORMATS[fmt]
    cands = [(1 + (2 * m + 1) / 2 ** (mb + 1)) * 2.0 ** e
             for e in range(emin, emax + 1) for m in range(2 ** mb)]
    cands += [(2 * k + 1) * 2.0 ** (emin - mb - 1) for k in range(2 ** mb)]
    cands = np.array([c for c in cands if c < max_norm])
    row = rng.choice(cands, size=length) * rng.choice([-1.0, 1.0], size=length)
    for start in range(0, length, block):
        n = min(block, length - start)
        row[start + rng.integers(n)] = 2.0 ** emax * rng.choice([-1.0, 1.0])
    return (row * 2.0 ** scale_exp).astype(np.float32)


def to_np(t):
    assert str(t.dtype) == "torch.float32", t.dtype  # no silent dtype changes
    return t.detach().cpu().numpy().copy()


def save_npz(path, arrays):
    for k, v in arrays.items():
        assert v.dtype == np.float32 or v.dtype.kind in "UbU", (k, v.dtype)
    np.savez_compressed(path, **arrays)
    print(f"wrote {path} ({os.path.getsize(path) / 1024:.1f} KiB, {len(arrays)} arrays)")


def import_mx(src):
    """Put the directory holding the `mx` package first on sys.path and import it."""
    src = os.path.abspath(src)
    if not os.path.isdir(os.path.join(src, "mx")) and os.path.isdir(os.path.join(src, "olmo", "mx")):
        src = os.path.join(src, "olmo")
    assert os.path.isdir(os.path.join(src, "mx")), f"no mx package under {src}"
    sys.path.insert(0, src)
    import mx  # noqa: F401
    assert os.path.dirname(os.path.dirname(os.path.abspath(mx.__file__))) == src, mx.__file__
    return src, mx


def common_meta(src):
    import torch
    return {"commit": sarr(git_commit(src)), "torch_version": sarr(torch.__version__),
            "src": sarr(src)}


# --------------------------------------------------------------------------
# upstream: Linear
# --------------------------------------------------------------------------
def linear_specs(mx, fmts, rnd="nearest", qbp=True):
    w, a, w_bp, a_bp_ex, a_bp_os = fmts
    return mx.specs.finalize_mx_specs({
        "w_elem_format": w, "a_elem_format": a, "w_elem_format_bp": w_bp,
        "a_elem_format_bp_ex": a_bp_ex, "a_elem_format_bp_os": a_bp_os,
        "block_size": 32, "scale_bits": 8, "bfloat": 16, "round": rnd,
        "custom_cuda": False, "quantize_backprop": qbp,
    })


def linear_inputs(seed, M, K, N, fmts, row_scale, zero_row):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((M, K)).astype(np.float32)
    if row_scale:  # per-row scale, log-uniform in [1e-2, 1e2]
        x *= (10.0 ** rng.uniform(-2, 2, size=(M, 1))).astype(np.float32)
    bound = 1.0 / np.sqrt(K)
    w = rng.uniform(-bound, bound, size=(N, K)).astype(np.float32)
    b = rng.uniform(-bound, bound, size=(N,)).astype(np.float32)
    g = (rng.standard_normal((M, N)) * 1e-3).astype(np.float32)
    # special rows: 0-2 bf16 ties, 3-4 MX-element ties of the forward act format,
    # 5 a 'spiky' row (one element x1000 per block), optional last row zero
    x[0:3] = bf16_ties(x[0:3])
    x[3] = mx_tie_row(rng, K, fmts[1], int(rng.integers(-10, 6)))
    x[4] = mx_tie_row(rng, K, fmts[1], int(rng.integers(-10, 6)))
    x[5, ::32] *= np.float32(1000.0)
    if zero_row:
        x[M - 1] = 0.0
    w[0] = bf16_ties(w[0])
    g[0:2] = bf16_ties(g[0:2])
    g[2] = mx_tie_row(rng, N, fmts[4], -18)  # ties for the a_bp_os (grad-output) format
    return x, w, b, g


def run_linear(linmod, specs, x, w, b, g):
    import torch
    xt = torch.from_numpy(x.copy()).requires_grad_(True)
    wt = torch.from_numpy(w.copy()).requires_grad_(True)
    bt = torch.from_numpy(b.copy()).requires_grad_(True)
    y = linmod.linear(xt, wt, bt, mx_specs=specs)
    assert y.dtype == torch.float32
    y.backward(torch.from_numpy(g.copy()))
    return {"y": to_np(y), "dx": to_np(xt.grad), "dw": to_np(wt.grad), "db": to_np(bt.grad)}


def gen_upstream(src, out, profile):
    import torch
    src, mx = import_mx(src)
    linmod = importlib.import_module("mx.linear")  # `mx.linear` attr is the function
    shapes = PROFILES[profile]["linear"]
    cases = []  # name, (M,K,N), fmts, round, qbp, row_scale, zero_row, seed
    for i, s in enumerate(shapes["mixed"]):
        cases.append((f"mixed_s{i}", s, FMT_MIXED, "nearest", True, i < 2, i == 1, 100 + i))
    for i, s in enumerate(shapes["e4m3"]):
        cases.append((f"e4m3_s{i}", s, FMT_E4M3, "nearest", True, i == 1, False, 200 + i))
    for i, s in enumerate(shapes["fp6"]):
        cases.append((f"fp6_s{i}", s, FMT_FP6, "nearest", True, True, False, 300 + i))
    for i, s in enumerate(shapes["fwdonly"]):
        cases.append((f"fwdonly_s{i}", s, FMT_E4M3, "nearest", False, False, False, 400 + i))
    for i, s in enumerate(shapes["even"]):
        cases.append((f"even_s{i}", s, FMT_MIXED, "even", True, True, False, 500 + i))

    arrays = common_meta(src)
    arrays["cuda_bf16_supported"] = np.array(bool(torch.cuda.is_bf16_supported()))
    summary = []
    for name, (M, K, N), fmts, rnd, qbp, row_scale, zero_row, seed in cases:
        specs = linear_specs(mx, fmts, rnd, qbp)
        x, w, b, g = linear_inputs(seed, M, K, N, fmts, row_scale, zero_row)
        res = run_linear(linmod, specs, x, w, b, g)
        for k, v in {"x": x, "w": w, "b": b, "g": g, **res}.items():
            arrays[f"{name}/{k}"] = v
        arrays[f"{name}/specs_json"] = sarr(json.dumps(dict(specs.data), sort_keys=True))
        line = f"{name}: M={M} K={K} N={N} fmts={fmts} round={rnd} qbp={qbp} y{res['y'].shape}"
        # show that the rounding mode matters: same inputs, other round mode
        other = "even" if rnd == "nearest" else "nearest"
        if name.startswith(("mixed", "even")):
            alt = run_linear(linmod, linear_specs(mx, fmts, other, qbp), x, w, b, g)
            fr = {k: float(np.mean(alt[k] != res[k])) for k in ("y", "dx", "dw", "db")}
            line += f"  | frac changed with round={other}: " + " ".join(f"{k}={v:.4f}" for k, v in fr.items())
        summary.append(line)
    path = os.path.join(out, "mx_linear_upstream.npz")
    save_npz(path, arrays)
    print("\n".join(summary))
    verify(path)


# --------------------------------------------------------------------------
# fork: LayerNorm
# --------------------------------------------------------------------------
def fork_specs(mx, fmts=FMT_E4M3, qbp=True, noq_ln=False):
    w, a, w_bp, a_bp_ex, a_bp_os = fmts
    return mx.specs.finalize_mx_specs({
        "w_elem_format": w, "a_elem_format": a, "w_elem_format_bp": w_bp,
        "a_elem_format_bp_ex": a_bp_ex, "a_elem_format_bp_os": a_bp_os,
        "block_size": 32, "scale_bits": 8, "bfloat": 16, "round": "nearest",
        "custom_cuda": False, "quantize_backprop": qbp,
        "bump_up_overflow_exponent": False, "dont_quantize_layernorm": noq_ln,
        "dont_quantize_gelu": False,
    })


def ln_inputs(seed, M, D, gain_center):
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((M, D)) * 3 + 0.5).astype(np.float32)
    gain = (gain_center + 0.02 * rng.standard_normal(D)).astype(np.float32)
    bias = (0.01 * rng.standard_normal(D)).astype(np.float32)
    g = (rng.standard_normal((M, D)) * 1e-3).astype(np.float32)
    x[0] = bf16_ties(x[0])        # one row of exact bf16 ties
    gain[:4] = bf16_ties(gain[:4])  # a few gains that are bf16 ties
    g[0] = bf16_ties(g[0])
    return x, gain, bias, g


def gen_layernorm(mx, src, out, profile):
    import torch
    lnmod = importlib.import_module("mx.layernorm")
    prof = PROFILES[profile]
    cases = []  # name, (M, D), qbp, noq, seed, gain_center
    for kind, qbp, noq in (("ln_q", True, False), ("ln_noq", True, True), ("ln_fwdonly", False, False)):
        for i, s in enumerate(prof["ln"]):
            cases.append((f"{kind}_s{i}", s, qbp, noq, 600 + i, 1.0))
    cases.append(("ln_q_g093", prof["ln_g093"], True, False, 700, 0.93))
    arrays = common_meta(src)
    arrays["eps"] = np.array(1e-5, dtype=np.float32)
    for name, (M, D), qbp, noq, seed, gc in cases:
        specs = fork_specs(mx, FMT_E4M3, qbp, noq)
        x, gain, bias, g = ln_inputs(seed, M, D, gc)
        xt = torch.from_numpy(x.copy()).requires_grad_(True)
        wt = torch.from_numpy(gain.copy()).requires_grad_(True)
        bt = torch.from_numpy(bias.copy()).requires_grad_(True)
        y = lnmod.LayerNormFunction.apply(xt, wt, bt, 1e-5, specs, None)
        y.backward(torch.from_numpy(g.copy()))
        d = {"x": x, "gain": gain, "bias": bias, "g": g, "y": to_np(y),
             "dx": to_np(xt.grad), "dgain": to_np(wt.grad),
             "has_dbias": np.array(bt.grad is not None)}
        if bt.grad is not None:
            d["dbias"] = to_np(bt.grad)
        for k, v in d.items():
            arrays[f"{name}/{k}"] = v
        arrays[f"{name}/specs_json"] = sarr(json.dumps(dict(specs.data), sort_keys=True))
        print(f"{name}: M={M} D={D} qbp={qbp} dont_quantize_layernorm={noq} "
              f"gain~{gc} has_dbias={bt.grad is not None}")
    path = os.path.join(out, "mx_layernorm_fork.npz")
    save_npz(path, arrays)
    verify(path)


def gen_bump(mx, src, out):
    """The fork's ``bump_up_overflow_exponent`` on ``quantize_mx_op`` (E4M3,
    round "nearest", 32-element blocks): tensors of one block and of several
    blocks along the quantized axis, both axes of a matrix, a 3-D tensor."""
    import torch
    opsmod = importlib.import_module("mx.mx_ops")
    rng = np.random.default_rng(900)
    arrays = common_meta(src)
    cases = {"one_block": ((16, 32), -1), "rows": ((24, 96), -1), "cols": ((96, 40), 0), "ragged": ((8, 80), -1),
             "three_d": ((3, 5, 64), -1)}
    for name, (shape, axis) in cases.items():
        x = (rng.standard_normal(shape) * np.exp2(rng.integers(-3, 4, shape))).astype(np.float32)
        flat = x.reshape(-1)
        flat[rng.integers(0, flat.size, flat.size // 20)] *= 1.85  # significands above 1.75 here and there
        for bump in (False, True):
            specs = fork_specs(mx)
            specs["bump_up_overflow_exponent"] = bump
            y = opsmod.quantize_mx_op(torch.from_numpy(x.copy()), specs, elem_format="fp8_e4m3", axes=[axis],
                                      round="nearest")
            arrays[f"{name}/{'bump' if bump else 'floor'}"] = to_np(y)
        arrays[f"{name}/x"] = x
        arrays[f"{name}/axis"] = sarr(str(axis))
        print(f"bump {name}: shape {shape} axis {axis}: "
              f"{np.mean(arrays[f'{name}/bump'] != arrays[f'{name}/floor']):.3f} of the elements change")
    path = os.path.join(out, "mx_bump_fork.npz")
    save_npz(path, arrays)
    verify(path)


# --------------------------------------------------------------------------
# fork: student/teacher proxy (one child process per recipe)
# --------------------------------------------------------------------------
STUDENT_CASES = {"e4m3": FMT_E4M3, "mix": FMT_MIXED}


def load_student_teacher(olmo_dir):
    sys.modules["wandb"] = types.ModuleType("wandb")  # stub: their script only logs to it
    path = os.path.join(olmo_dir, "synthetic", "student_teacher.py")
    spec = importlib.util.spec_from_file_location("student_teacher", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules["student_teacher"] = mod
    spec.loader.exec_module(mod)
    return mod


def student_child(src, case, tmp_out, width, depth, batch):
    """Runs in its own process: build, (then) inject, step. Writes tmp_out."""
    import torch
    import torch.nn.functional as F
    src, mx = import_mx(src)
    st = load_student_teacher(src)
    torch_gelu = F.gelu

    torch.manual_seed(0)
    model = st.ResidualMLP(width, depth, True, "gelu")
    init = {k: to_np(v) for k, v in model.state_dict().items()}
    teacher = st.make_teacher(input_dim=width, teacher_width=width, depth=depth, act="gelu")

    rng = np.random.default_rng(1234)
    xs = rng.standard_normal((4, batch, width)).astype(np.float32)
    noise = rng.standard_normal((4, batch, width)).astype(np.float32)
    with torch.no_grad():  # targets computed in fp32, before injection
        ys = np.stack([to_np(teacher(torch.from_numpy(xs[i]))) for i in range(4)])
    ys = (ys + np.float32(0.005) * noise).astype(np.float32)

    opt = torch.optim.Adam(model.parameters(), lr=6e-4, betas=(0.9, 0.999))
    w, a, w_bp, a_bp_ex, a_bp_os = STUDENT_CASES[case]
    args = argparse.Namespace(
        w_elem_format=w, a_elem_format=a, w_elem_format_bp_w=w_bp,
        a_elem_format_bp_ex=a_bp_ex, a_elem_format_bp_os=a_bp_os,
        block_size=32, scale_bits=8, use_custom_cuda=False, dont_quantize_backprop=False,
        bump_up_overflow_exponent=False, dont_quantize_layernorm=False, dont_quantize_gelu=False)
    specs = st.make_mx_specs(args)
    st.mx_mapping.inject_pyt_ops(specs)  # exactly as mx_loop: after building model/optimizer
    assert F.gelu is not torch_gelu and F.linear.__name__ == "wrapper"

    # gradient check on batch 0 (no optimizer step)
    opt.zero_grad(set_to_none=True)
    x0, y0 = torch.from_numpy(xs[0].copy()), torch.from_numpy(ys[0].copy())
    out = model(x0)
    loss = F.mse_loss(out, y0)
    loss.backward()
    nodes, stack, seen = set(), [loss.grad_fn], set()
    while stack:
        n = stack.pop()
        if n is None or id(n) in seen:
            continue
        seen.add(id(n))
        nodes.add(type(n).__name__)
        stack.extend(f for f, _ in n.next_functions)
    res = {"out": to_np(out), "loss": np.array(loss.item(), dtype=np.float32)}
    none_grads = []
    for n, p in model.named_parameters():
        if p.grad is None:
            none_grads.append(n)
            res[f"grad/{n}"] = np.zeros(tuple(p.shape), np.float32)
        else:
            res[f"grad/{n}"] = to_np(p.grad)
    res["none_grads"] = sarr(*none_grads) if none_grads else np.array([], dtype="<U1")
    res["autograd_nodes"] = sarr(*sorted(nodes))
    res["gelu_is_torch"] = np.array(all(blk.act_fn is torch_gelu for blk in model.layers))
    res["ln_bias_grad_none"] = np.array(all(blk.ln.bias.grad is None for blk in model.layers))
    res["specs_json"] = sarr(json.dumps(dict(specs.data), sort_keys=True))

    # three Adam steps on batches 1..3, as in mx_loop
    step_losses = []
    for i in range(1, 4):
        opt.zero_grad(set_to_none=True)
        lo = F.mse_loss(model(torch.from_numpy(xs[i].copy())), torch.from_numpy(ys[i].copy()))
        lo.backward()
        step_losses.append(lo.item())
        opt.step()
    res["step_losses"] = np.array(step_losses, dtype=np.float32)
    for n, p in model.named_parameters():
        res[f"final/{n}"] = to_np(p)
    for k, v in init.items():
        res[f"init/{k}"] = v
    res["xs"], res["ys"] = xs, ys
    np.savez(tmp_out, **res)


def gen_student(src, out, profile):
    cfg = PROFILES[profile]["student"]
    arrays = common_meta(src)
    arrays["config_json"] = sarr(json.dumps({
        **cfg, "act": "gelu", "ln": True, "model_seed": "torch.manual_seed(0)",
        "targets": "their make_teacher(d, d, depth, 'gelu') fp32 (built right after the student) "
                   "+ 0.005*N(0,1)", "data_seed": 1234, "adam": {"lr": 6e-4, "betas": [0.9, 0.999]},
        "batch0": "loss/grads only, no optimizer step", "steps": "3 Adam steps on steps/x[i], steps/y[i]"}))
    ref = None
    with tempfile.TemporaryDirectory() as td:
        for case in STUDENT_CASES:
            tmp = os.path.join(td, f"{case}.npz")
            cmd = [sys.executable, os.path.abspath(__file__), "--library", "fork", "--src", src,
                   "--student-child", case, "--child-out", tmp, "--profile", profile]
            subprocess.run(cmd, check=True)
            with np.load(tmp, allow_pickle=False) as z:
                d = {k: z[k] for k in z.files}
            shared = {k: v for k, v in d.items() if k.startswith("init/")}
            shared["batch0/x"], shared["batch0/y"] = d["xs"][0], d["ys"][0]
            shared["steps/x"], shared["steps/y"] = d["xs"][1:], d["ys"][1:]
            if ref is None:
                ref = shared
                arrays.update(shared)
            else:  # both children must have seen the same init and data
                assert all(np.array_equal(ref[k], shared[k]) for k in ref), "children disagree on init/data"
            for k, v in d.items():
                if not (k.startswith("init/") or k in ("xs", "ys")):
                    arrays[f"{case}/{k}"] = v
            print(f"student {case}: loss={float(d['loss']):.6g} step_losses={d['step_losses']} "
                  f"none_grads={[str(n) for n in d['none_grads']]} gelu_is_torch={bool(d['gelu_is_torch'])} "
                  f"ln_bias_grad_none={bool(d['ln_bias_grad_none'])}\n  autograd nodes: "
                  f"{[str(n) for n in d['autograd_nodes']]}")
    path = os.path.join(out, "mx_student_fork.npz")
    save_npz(path, arrays)
    verify(path)


# --------------------------------------------------------------------------
def verify(path):
    with np.load(path, allow_pickle=False) as z:
        groups = {}
        for k in z.files:
            a = z[k]
            assert a.dtype == np.float32 or a.dtype.kind in "Ub", (k, a.dtype)
            if a.dtype == np.float32:
                assert np.all(np.isfinite(a)), k
            groups.setdefault(k.split("/")[0], []).append(f"{k.split('/', 1)[-1]}{list(a.shape)}")
    print(f"verified {os.path.basename(path)}: {len(z.files)} arrays")
    for g, items in groups.items():
        txt = ", ".join(items)
        print(f"  {g}: {txt[:160]}{'...' if len(txt) > 160 else ''}")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--library", choices=["upstream", "fork"], required=True)
    p.add_argument("--src", required=True, help="directory holding the `mx` package "
                   "(fork: systems-scaling/olmo, or the repo root)")
    p.add_argument("--out", default="tests/data")
    p.add_argument("--profile", choices=sorted(PROFILES), default="compact")
    p.add_argument("--only", choices=["bump", "layernorm", "student"], help="fork: generate one file only")
    p.add_argument("--student-child", choices=sorted(STUDENT_CASES), help=argparse.SUPPRESS)
    p.add_argument("--child-out", help=argparse.SUPPRESS)
    a = p.parse_args()

    import torch
    torch.set_num_threads(1)
    torch.set_default_dtype(torch.float32)

    if a.student_child:
        cfg = PROFILES[a.profile]["student"]
        student_child(a.src, a.student_child, a.child_out, cfg["width"], cfg["depth"], cfg["batch"])
        return
    os.makedirs(a.out, exist_ok=True)
    if a.library == "upstream":
        gen_upstream(a.src, a.out, a.profile)
    else:
        src, mx = import_mx(a.src)
        if a.only in (None, "bump"):
            gen_bump(mx, src, a.out)
        if a.only in (None, "layernorm"):
            gen_layernorm(mx, src, a.out, a.profile)
        if a.only in (None, "student"):
            gen_student(src, a.out, a.profile)


if __name__ == "__main__":
    main()
