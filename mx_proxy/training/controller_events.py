"""A recorded controller run as events: the steps at which each unit was promoted to the controller's higher
precision and released back (:func:`events`, host side, from the metrics a run recorded)."""

from __future__ import annotations

import numpy as np

__all__ = ["EVENT_COLUMNS", "events"]

EVENT_COLUMNS = ("step", "unit", "event", "gnmr", "delta_gnmr")


def events(steps, promoted, gnmr, delta_gnmr, names):
    """Promote/release rows from a recorded run (numpy inputs).

    ``steps`` (T,); ``promoted`` (T, U) bool, the mask in force at each step;
    ``gnmr``/``delta_gnmr`` (T, U), row r from the update after step r. One
    row per transition of a unit: ``step`` is the first step it ran promoted
    ("promote") or back in low precision ("release"); ``gnmr``/``delta_gnmr``
    are the ratios of the update that decided it (the row before; for a
    promotion, the values that triggered it). The trace is taken to start in
    low precision (a unit promoted at row 0 gives a "promote" with NaN ratios).
    Rows sorted by step, then unit order. Columns :data:`EVENT_COLUMNS`.
    """
    import pandas as pd  # here, not at the top: the engine imports the controllers and stays free of pandas

    steps = np.asarray(steps)
    mask = np.asarray(promoted, bool)
    gnmr, delta_gnmr = np.asarray(gnmr, np.float64), np.asarray(delta_gnmr, np.float64)
    names = tuple(names)
    T = steps.shape[0]
    if mask.ndim != 2 or mask.shape[0] != T or mask.shape[1] != len(names) \
            or gnmr.shape != mask.shape or delta_gnmr.shape != mask.shape:
        raise ValueError(f"events needs steps (T,) and promoted/gnmr/delta_gnmr (T, U={len(names)}); got "
                         f"{steps.shape}, {mask.shape}, {gnmr.shape}, {delta_gnmr.shape}")
    prev = np.concatenate([np.zeros((1, mask.shape[1]), bool), mask[:-1]])
    nan = np.full((1, mask.shape[1]), np.nan)
    g_prev = np.concatenate([nan, gnmr[:-1]])
    d_prev = np.concatenate([nan, delta_gnmr[:-1]])
    rows, cols = np.nonzero(mask != prev)                      # row-major: by step, then unit
    frame = pd.DataFrame({
        "step": steps[rows].astype(np.int64),
        "unit": pd.Series([names[c] for c in cols], dtype=object),
        "event": pd.Series(np.where(mask[rows, cols], "promote", "release"), dtype=object),
        "gnmr": g_prev[rows, cols],
        "delta_gnmr": d_prev[rows, cols],
    }, columns=list(EVENT_COLUMNS))
    return frame.reset_index(drop=True)
