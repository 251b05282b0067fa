"""The decoder-only transformer comparison: same init and batches for every recipe, deterministic (same seed ->
bit-identical losses), the copy task as documented, bad input refused before any work, the history written."""

import dataclasses

import numpy as np
import pandas as pd
import pytest

from mx_proxy.experiments import transformer
from mx_proxy.interop.linen import quantize

TINY = dataclasses.replace(transformer.SCALES["smoke"], depth=1, heads=1, vocab=8, seq_len=8, batch=4, steps=3)


def test_the_copy_task_repeats_its_first_half_and_is_the_same_for_every_call():
    b = transformer.batch(TINY, 0, 5)
    assert b.shape == (TINY.batch, TINY.seq_len) and b.dtype == np.int32
    np.testing.assert_array_equal(b[:, :4], b[:, 4:])
    assert int(b.min()) >= 1 and int(b.max()) < TINY.vocab
    np.testing.assert_array_equal(b, transformer.batch(TINY, 0, 5))
    assert not np.array_equal(b, transformer.batch(TINY, 0, 6))


def test_one_rules_call_quantizes_every_projection_and_norm():
    q = quantize(transformer.decoder(TINY), {"*": "mxfp8_e4m3"}, transformer.batch(TINY, 0, 0)[:, :-1])
    kinds = dict(q.layers)
    assert kinds["block_0/attn/query"] == "DenseGeneral" and kinds["block_0/attn/out"] == "DenseGeneral"
    assert kinds["block_0/mlp_in"] == "Dense" and kinds["head"] == "Dense"
    assert kinds["block_0/attn_norm"] == "RMSNorm" and kinds["final_norm"] == "RMSNorm"
    assert set(q.table()["recipe"]) == {"mxfp8_e4m3"}


def test_smoke_comparison_is_deterministic_and_shares_the_init():
    first = transformer.compare(TINY, ("fp32", "mxfp8_e4m3"), seed=3)
    again = transformer.compare(TINY, ("fp32", "mxfp8_e4m3"), seed=3)
    pd.testing.assert_frame_equal(first.history, again.history, check_exact=True)
    h = first.history
    assert list(h.groupby("recipe", sort=False).size()) == [TINY.steps, TINY.steps]
    fp32, mx = (h[h["recipe"] == r]["loss"].to_numpy() for r in ("fp32", "mxfp8_e4m3"))
    assert np.all(np.isfinite(fp32)) and np.all(np.isfinite(mx))
    # the same parameters at step 0: the losses differ only by the quantization (well under a nat)
    assert 0 < abs(fp32[0] - mx[0]) < 0.1
    assert h[h["recipe"] == "fp32"]["zeta"].isna().all()
    zeta = h[h["recipe"] == "mxfp8_e4m3"]["zeta"].to_numpy()
    assert np.all((zeta > 0) & (zeta < 1))
    s = transformer.summary(first)
    assert list(s["recipe"]) == ["fp32", "mxfp8_e4m3"] and s["blowup_at"].isna().all()
    np.testing.assert_allclose(s.iloc[1]["zeta_mean"], zeta.mean())


def test_the_losses_depend_on_the_seed():
    a = transformer.compare(TINY, ("fp32",), seed=0).history["loss"].to_numpy()
    b = transformer.compare(TINY, ("fp32",), seed=1).history["loss"].to_numpy()
    assert not np.array_equal(a, b)


@pytest.mark.parametrize("kwargs, match", [({"scale": "huge"}, "smoke, quick, gpu"),
                                           ({"recipe_names": ("mxfp9",)}, "mxfp9"),
                                           ({"recipe_names": ()}, "no recipe"),
                                           ({"seed": -1}, "seed")])
def test_bad_input_is_refused_before_any_work(kwargs, match, monkeypatch):
    monkeypatch.setattr(transformer, "_train", lambda *a: pytest.fail("trained"))
    with pytest.raises(ValueError, match=match):
        transformer.compare(**({"scale": TINY} | kwargs))


@pytest.mark.parametrize("field, value", [("width", 48), ("seq_len", 7), ("steps", 0), ("lr", -1.0),
                                          ("vocab", 1)])
def test_a_bad_scale_is_refused(field, value):
    with pytest.raises(ValueError, match=field):
        dataclasses.replace(TINY, **{field: value})


@pytest.mark.parametrize("suffix", [".csv", ".parquet"])
def test_write_round_trips_the_history(tmp_path, suffix):
    history = pd.DataFrame({"recipe": ["fp32"], "step": [0], "loss": [1.5], "zeta": [np.nan], "cosine": [np.nan]})
    result = transformer.Comparison(TINY, 0, history, pd.DataFrame())
    path = transformer.write(result, tmp_path / f"h{suffix}")
    back = pd.read_csv(path) if suffix == ".csv" else pd.read_parquet(path)
    pd.testing.assert_frame_equal(back, history)
    with pytest.raises(ValueError, match=".parquet or .csv"):
        transformer.write(result, tmp_path / "h.json")
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"h{suffix}"]  # no temporary left behind
