"""A small decoder-only transformer, not the proxy, trained FP32 vs MX recipes side by side.

The model (:class:`Decoder`) is written as a user writes one, with nothing of
``mx_proxy`` in it: ``flax.linen`` token and position embeddings, ``depth``
pre-norm blocks (``nn.RMSNorm``, causal ``nn.MultiHeadDotProductAttention``,
a GELU MLP of two ``nn.Dense``), a final ``nn.RMSNorm`` and a ``nn.Dense``
head. :func:`compare` quantizes it with one call of the rules API
(``quantize(Decoder(...), {"*": recipe}, tokens)``: every Dense,
DenseGeneral (the attention's query/key/value/output projections) and
RMSNorm; the embeddings and the attention's score and value products
stay in float32, as qwix and Transformer Engine leave them) and trains each
recipe of :data:`RECIPES` from the same initial parameters on the same
batches with Adam; ``fp32`` is the model as written, unquantized.

The task (:func:`batch`): copying. Each sequence is ``seq_len // 2`` tokens
drawn uniformly from ``1 … vocab − 1`` followed by the same tokens again;
the loss is the next-token cross-entropy (nats) over the second half, which
a model can only predict by attending back ``seq_len // 2`` positions (the
first half is noise: its loss is not counted). Batch ``step`` is drawn from
``fold_in(key(seed + 1), step)``: the same for every recipe.

At every step each MX run also measures its gradient bias
(:func:`mx_proxy.experiments.instruments.compare_gradients`: ζ and the cosine
of the gradient it steps with against the unquantized model's at the same
parameters and batch, inside the same jitted step); at
the end its operand statistics on the last batch
(:func:`~mx_proxy.experiments.instruments.quant_table`); the blow-up rule
(:func:`~mx_proxy.experiments.instruments.blowup_at`) reads each loss history.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pandas as pd

from mx_proxy.experiments import instruments
from mx_proxy.interop.linen import quantize
from mx_proxy.numerics import recipe as recipes
from mx_proxy.store import durable
from mx_proxy.training.config import BOUNDS

__all__ = ["TransformerScale", "SCALES", "RECIPES", "Decoder", "decoder", "batch", "loss_fn", "Comparison", "compare",
           "summary", "write"]

RECIPES = ("fp32", "mxfp8_e4m3", "paper_e4m3")
"""The recipes :func:`compare` trains by default: the model as written, MX FP8 E4M3, the authors' computation."""


@dataclasses.dataclass(frozen=True)
class TransformerScale:
    """Sizes of one comparison: a vocabulary of ``vocab`` tokens, sequences of ``seq_len`` (even), residual
    width ``width`` (a multiple of 32, the MX block, and of ``heads``), ``depth`` blocks, ``batch`` sequences
    per step, ``steps`` Adam steps at learning rate ``lr``."""

    vocab: int
    seq_len: int
    width: int
    depth: int
    heads: int
    batch: int
    steps: int
    lr: float

    def __post_init__(self):
        for name in ("vocab", "seq_len", "width", "depth", "heads", "batch", "steps"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"TransformerScale.{name} must be a positive integer, got {value!r}")
        if self.vocab < 2:
            raise ValueError(f"TransformerScale.vocab must be at least 2 (token 0 and one more), got {self.vocab}")
        if self.seq_len < 2 or self.seq_len % 2:
            raise ValueError(f"TransformerScale.seq_len must be even and at least 2, got {self.seq_len}")
        if self.width % 32 or self.width % self.heads:
            raise ValueError(f"TransformerScale.width must be a multiple of 32 (the MX block) and of heads="
                             f"{self.heads}, got {self.width}")
        if not (isinstance(self.lr, (int, float)) and self.lr > 0):
            raise ValueError(f"TransformerScale.lr must be positive, got {self.lr!r}")


SCALES = {
    "smoke": TransformerScale(vocab=16, seq_len=16, width=32, depth=2, heads=2, batch=8, steps=8, lr=3e-3),
    "quick": TransformerScale(vocab=16, seq_len=16, width=32, depth=2, heads=2, batch=16, steps=150, lr=3e-3),
    "gpu": TransformerScale(vocab=128, seq_len=128, width=256, depth=4, heads=8, batch=64, steps=2000, lr=1e-3),
}
"""smoke: seconds on a CPU (the tests); quick: minutes on a 2-core CPU (the notebook's size); gpu: one GPU."""


class Block(nn.Module):
    """One pre-norm block: causal self-attention and a GELU MLP, each added to the residual stream."""

    width: int
    heads: int

    @nn.compact
    def __call__(self, x, mask):
        h = nn.RMSNorm(name="attn_norm")(x)
        x = x + nn.MultiHeadDotProductAttention(self.heads, name="attn")(h, mask=mask)
        h = nn.RMSNorm(name="mlp_norm")(x)
        return x + nn.Dense(self.width, name="mlp_out")(nn.gelu(nn.Dense(4 * self.width, name="mlp_in")(h)))


class Decoder(nn.Module):
    """Tokens (batch, T) int32 → next-token logits (batch, T, vocab) float32; T at most ``max_len``."""

    vocab: int
    width: int
    depth: int
    heads: int
    max_len: int

    @nn.compact
    def __call__(self, tokens):
        x = nn.Embed(self.vocab, self.width, name="embed")(tokens)
        pos = self.param("pos", nn.initializers.normal(0.02), (self.max_len, self.width))
        x = x + pos[: tokens.shape[-1]]
        mask = nn.make_causal_mask(tokens)
        for i in range(self.depth):
            x = Block(self.width, self.heads, name=f"block_{i}")(x, mask)
        return nn.Dense(self.vocab, name="head")(nn.RMSNorm(name="final_norm")(x))


def decoder(scale: TransformerScale) -> Decoder:
    """The :class:`Decoder` of a scale (its inputs are sequences of ``seq_len - 1`` tokens)."""
    return Decoder(scale.vocab, scale.width, scale.depth, scale.heads, scale.seq_len)


def batch(scale: TransformerScale, seed: int, step: int) -> jax.Array:
    """Batch ``step`` of the copy task: (batch, seq_len) int32, each row a half of tokens in 1 … vocab − 1 and
    the same half again (module docstring)."""
    key = jax.random.fold_in(jax.random.key(seed + 1), step)
    half = jax.random.randint(key, (scale.batch, scale.seq_len // 2), 1, scale.vocab, dtype=jnp.int32)
    return jnp.concatenate([half, half], axis=1)


def loss_fn(apply, scale: TransformerScale):
    """``loss(params, tokens)``: the mean cross-entropy (nats) of predicting the second half of ``tokens``
    (batch, seq_len) with ``apply(params, tokens[:, :-1])`` (the model's ``apply`` or a quantized one's)."""
    start = scale.seq_len // 2 - 1  # the position whose next token is the first of the copy

    def loss(params, tokens):
        logits = apply(params, tokens[:, :-1])
        ce = optax.softmax_cross_entropy_with_integer_labels(logits[:, start:], tokens[:, start + 1:])
        return jnp.mean(ce)

    return loss


@dataclasses.dataclass(frozen=True)
class Comparison:
    """What :func:`compare` measured: ``history`` (one row per recipe and step: ``recipe``, ``step``, ``loss``,
    and ``zeta``, ``cosine`` of an MX run's gradient at that step, NaN for FP32), ``quant`` (one row per
    recipe, layer and operand: the operand statistics after the last step; empty without ``quant_stats``)
    and the ``scale`` and ``seed``."""

    scale: TransformerScale
    seed: int
    history: pd.DataFrame
    quant: pd.DataFrame


def _train(name: str, scale: TransformerScale, seed: int, params0, model: Decoder, ref_loss, quant_stats: bool):
    """(history rows, quant table) of one recipe."""
    if name == "fp32":
        loss = ref_loss
    else:
        q = quantize(model, {"*": name}, jax.ShapeDtypeStruct((scale.batch, scale.seq_len - 1), jnp.int32))
        loss = loss_fn(q.apply, scale)
    opt = optax.adam(scale.lr)

    @jax.jit
    def step(params, state, tokens):
        value, grads = jax.value_and_grad(loss)(params, tokens)
        if name == "fp32":
            bias = (jnp.float32(jnp.nan), jnp.float32(jnp.nan))
        else:  # the FP32 model's gradient at the same parameters and batch
            b = instruments.compare_gradients(grads, jax.grad(ref_loss)(params, tokens))
            bias = (b.zeta, b.cosine)
        updates, state = opt.update(grads, state, params)
        return optax.apply_updates(params, updates), state, value, bias

    params, state, rows = params0, opt.init(params0), []
    for i in range(scale.steps):
        params, state, value, (zeta, cosine) = step(params, state, batch(scale, seed, i))
        rows.append({"recipe": name, "step": i, "loss": float(value), "zeta": float(zeta), "cosine": float(cosine)})
    quant = pd.DataFrame()
    if name != "fp32" and quant_stats:
        quant = instruments.quant_table(loss, params, batch(scale, seed, scale.steps - 1))
        quant.insert(0, "recipe", name)
    return rows, quant


def compare(scale: TransformerScale | str = "smoke", recipe_names=RECIPES, seed: int = 0, *,
            quant_stats: bool = False) -> Comparison:
    """Train :class:`Decoder` at ``scale`` (a :class:`TransformerScale` or a name of :data:`SCALES`) under each
    recipe of ``recipe_names`` from the same initial parameters (``key(seed)``) on the same batches.
    ``quant_stats``: also measure every operand's statistics after the last step (the slowest part to compile).

    Raises:
      ValueError: an unknown scale or recipe (naming the valid ones), no recipe, a bad seed.
    """
    if isinstance(scale, str):
        if scale not in SCALES:
            raise ValueError(f"unknown transformer scale {scale!r}; valid: {', '.join(SCALES)}")
        scale = SCALES[scale]
    if not isinstance(scale, TransformerScale):
        raise TypeError(f"scale must be a TransformerScale or one of {', '.join(SCALES)}, got {scale!r}")
    lo, hi = BOUNDS["seed"]  # the Config's seed range: key(seed) and key(seed + 1) both exist
    if isinstance(seed, bool) or not isinstance(seed, int) or not lo <= seed <= hi:
        raise ValueError(f"seed must be an integer in [{lo}, {hi}], got {seed!r}")
    names = tuple(recipe_names)
    if not names:
        raise ValueError(f"no recipe to train; e.g. {', '.join(RECIPES)}")
    for n in names:
        recipes.get(n)  # an unknown name is a ValueError naming the presets, before any work
    model = decoder(scale)
    params0 = model.init(jax.random.key(seed), batch(scale, seed, 0)[:, :-1])
    ref_loss = loss_fn(model.apply, scale)
    rows, quants = [], []
    for n in names:
        r, q = _train(n, scale, seed, params0, model, ref_loss, quant_stats)
        rows += r
        quants.append(q)
    history = pd.DataFrame(rows, columns=["recipe", "step", "loss", "zeta", "cosine"])
    quant = pd.concat([q for q in quants if len(q)], ignore_index=True) if any(len(q) for q in quants) else \
        pd.DataFrame()
    return Comparison(scale, seed, history, quant)


def summary(result: Comparison) -> pd.DataFrame:
    """One row per recipe: ``final_loss`` (mean of the last tenth of the steps), ``blowup_at`` (the blow-up
    rule's step, or NA), ``zeta_mean``/``zeta_last`` and ``cosine_last`` (NaN for FP32), and the final step's
    largest clamp, flush and last-bin fractions over every quantized operand (NaN for FP32)."""
    rows = []
    for name, h in result.history.groupby("recipe", sort=False):
        loss = h["loss"].to_numpy(dtype=float)
        tail = loss[-max(1, len(loss) // 10):]
        d = h.dropna(subset=["zeta"])
        q = result.quant[result.quant["recipe"] == name] if len(result.quant) else pd.DataFrame()
        stats = instruments.quant_summary(q) if len(q) else {f"max_{s}": np.nan for s in instruments.SUMMARY_STATS}
        rows.append({"recipe": name, "final_loss": float(tail.mean()), "blowup_at": instruments.blowup_at(loss),
                     "zeta_mean": float(d["zeta"].mean()) if len(d) else np.nan,
                     "zeta_last": float(d["zeta"].iloc[-1]) if len(d) else np.nan,
                     "cosine_last": float(d["cosine"].iloc[-1]) if len(d) else np.nan, **stats})
    df = pd.DataFrame(rows)
    df["blowup_at"] = df["blowup_at"].astype("Int64")
    return df


def write(result: Comparison, path) -> Path:
    """Write ``result.history`` atomically to ``path`` (.parquet or .csv, by its suffix); returns the path.

    Raises:
      ValueError: another suffix.
    """
    path = Path(path)
    if path.suffix not in (".parquet", ".csv"):
        raise ValueError(f"{path}: the file name must end in .parquet or .csv")
    if path.suffix == ".csv":
        return durable.write_output(path, lambda tmp: result.history.to_csv(tmp, index=False))
    return durable.write_output(path, lambda tmp: result.history.to_parquet(tmp, index=False))
