"""A live explorer: an ipywidgets panel that trains FP32 and MX runs and plots them as they train.

In a notebook cell::

    import mx_proxy as mxp
    panel = mxp.explore(store="runs", width=64, steps=1000)   # any Config field as a default
    panel                                                        # shows the panel; press Train

or headless, the same as pressing Train::

    panel.controls["recipes"].value = ("mxfp8_e4m3", "mxfp6_e2m3")
    panel.controls["norm"].value = "rmsnorm"
    runs = panel.train()          # [fp32, mxfp8_e4m3, mxfp6_e2m3] Runs; also panel.runs
    panel.snapshot()              # the live figure as a static PNG (for a saved notebook)
    panel.table()                 # one row per run of the latest training (pressing Train updates it)
    panel.conclusions()           # the same as Markdown sentences

The controls are the recipes (several may be chosen; FP32 is always trained
first, with the same seeds and therefore the same initial weights, batches
and batch order), activation, normalization, width, depth, learning rate,
steps, seed and diagnostics period; everything else comes from the base
config (the quick scale's, changed by the keyword defaults). While a run
trains, the figure (training loss, ‖ζ‖ bound, cosine between the MX and the
FP32 gradient at the same weights, fraction of LN gains the MX scale clamps)
and a progress bar update after every segment of the host loop (every
``val_every`` steps). Results land in ``store`` when one is given (a config
already there is loaded, not retrained) and are kept in ``panel.runs``;
:meth:`Explorer.table` and :meth:`Explorer.conclusions` read ``panel.runs``
when they are called, so a results cell rerun after pressing Train shows the
latest training.

Training goes through :func:`train_live`, the one place this module meets
the runner.
"""

from __future__ import annotations

import io
import math
import os
import time
from typing import Callable, Iterable

import pandas as pd
from matplotlib.figure import Figure

from mx_proxy.experiments import scales
from mx_proxy.nn.layers import ACTIVATIONS
from mx_proxy.nn.resmlp import NORMS
from mx_proxy.numerics.recipe import PRESETS, Recipe
from mx_proxy.runner.loop import train as _train
from mx_proxy.training.config import Config
from mx_proxy.training.result import Run
from mx_proxy.viz import plots

__all__ = ["explore", "Explorer", "train_live", "base_config", "PANELS", "CONTROLS"]

# (metrics column, axis label, y scale): the figure's panels, in order
PANELS = (("loss", "training loss", "log"), ("zeta_bound", "‖ζ‖ bound (vs FP32 at the same weights)", "linear"),
          ("cosine", "cosine(g_MX, g_FP32)", "linear"), ("ln_clamp_frac", "LN gains clamped (fraction)", "linear"))
# the columns of Explorer.table, after the recipe (its index)
TABLE_COLUMNS = ("final_loss", "vs_fp32", "zeta_median", "cosine_min", "ln_clamp_max", "diverged_at")
# what the panel shows where its widget cannot render (a saved notebook on a viewer without widgets)
TEXT_REPR = "mxp.explore() panel (a widget: run the notebook's cells in Jupyter to use it)"
# the panel's controls, each a Config field except "recipes"
CONTROLS = ("recipes", "act", "norm", "width", "depth", "lr", "steps", "seed", "diagnostics_every")
REFERENCE = "fp32"


def train_live(config: Config, store, on_update: Callable[[int, Run], None]) -> Run:
    """Train (or load from ``store``) one run, calling ``on_update(step,
    run_so_far)`` after every host-loop segment with the step reached and a
    :class:`Run` holding the metrics so far, and once more at the end with
    ``config.steps`` and the finished run (also when it was loaded from the
    store or diverged early). The one adapter between the explorer and the
    runner.

    Needs of the runner: ``train(config, store=..., progress=False,
    on_segment=f)`` calling ``f(step, runs)`` after each segment, ``runs`` a
    list with one :class:`Run` (metrics so far) per member.
    """
    def segment(step: int, runs: list[Run]) -> None:
        on_update(step, runs[0])

    run = _train(config, store=store, progress=False, on_segment=segment)
    on_update(config.steps, run)
    return run


def base_config(**defaults) -> Config:
    """The quick scale's config (``mx_proxy.experiments.scales.get("quick").config``) with
    ``defaults`` (Config fields) applied.

    Raises:
      ValueError: an unknown field (naming the valid ones) or a bad value.
    """
    return scales.get("quick").config.replace(**defaults)


def _recipe_defaults(recipe) -> tuple[tuple[str, ...], dict[str, Recipe]]:
    """(selected names, extra recipes) for a ``recipe`` default: a preset
    name, a :class:`Recipe`, or a sequence of them; FP32 is never selected
    (it always trains)."""
    items = [recipe] if isinstance(recipe, (str, Recipe)) else list(recipe)
    names, extra = [], {}
    for item in items:
        if isinstance(item, Recipe):
            if item.name in PRESETS and PRESETS[item.name] != item:
                raise ValueError(f"recipe {item.name!r} differs from the preset of that name; give it another name "
                                 f"(recipe.replace(name=...))")
            if item.name not in PRESETS:
                extra[item.name] = item
            name = item.name
        elif isinstance(item, str):
            if item not in PRESETS:
                raise ValueError(f"unknown recipe {item!r}; valid: {', '.join(PRESETS)}")
            name = item
        else:
            raise ValueError(f"recipe must be a preset name, a mxp.Recipe or a sequence of them, got {item!r}")
        if name != REFERENCE and name not in names:
            names.append(name)
    return tuple(names), extra


def _val_every(val_every: int, period: int) -> int:
    """The smallest multiple of the diagnostics ``period`` at least ``val_every``
    (a Config needs val_every to be a multiple of it); unchanged for period 0."""
    if not period or not val_every:
        return val_every
    return period * math.ceil(val_every / period)


def _widgets():
    try:
        import ipywidgets
    except ImportError as err:  # an optional dependency: say how to get it
        raise ImportError("mxp.explore needs ipywidgets: pip install 'mx-proxy[notebooks]' (or pip install "
                          "ipywidgets)") from err
    return ipywidgets


def _in_kernel() -> bool:
    """True inside a Jupyter kernel (where widgets and displays render)."""
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    shell = get_ipython()
    return shell is not None and getattr(shell, "kernel", None) is not None


def _controls(w, base: Config, recipes: list[str], chosen: tuple[str, ...]) -> dict:
    """The :data:`CONTROLS` widgets, starting at ``base``'s values and the ``chosen`` recipes."""
    wide = {"description_width": "initial"}

    def integer(name, lo, hi, label):
        return w.BoundedIntText(value=getattr(base, name), min=lo, max=hi, description=label, style=wide)

    return {
        "recipes": w.SelectMultiple(options=recipes, value=chosen, rows=6, description="MX recipes", style=wide),
        "act": w.Dropdown(options=ACTIVATIONS, value=base.act, description="activation", style=wide),
        "norm": w.Dropdown(options=NORMS, value=base.norm, description="norm", style=wide),
        "width": integer("width", 1, 1 << 16, "width"),
        "depth": integer("depth", 1, 256, "depth"),
        "lr": w.FloatText(value=base.lr, description="LR", style=wide),
        "steps": integer("steps", 1, 10 ** 8, "steps"),
        "seed": integer("seed", 0, 2 ** 32 - 1, "seed"),
        "diagnostics_every": integer("diagnostics_every", 0, 10 ** 6, "diagnostics every"),
    }


class Explorer:
    """The explorer panel (see the module docstring). Display it in a
    notebook (it renders as its widget, :attr:`widget`); drive it with
    :attr:`controls` and :meth:`train`.

    Attributes:
      controls: ``{name: widget}`` for :data:`CONTROLS`.
      button, progress, status, output: the Train button, the progress bar
        (steps of all runs of one training), an HTML status line and the
        Output the live figure is shown in.
      figure: the live ``matplotlib.figure.Figure`` (one panel per :data:`PANELS`).
      runs: the :class:`Run` s of the last training, FP32 first.
      updates: ``(recipe name, step)`` of every live update of the last training.
      store: where runs land (``None``: memory only).
    """

    def __init__(self, store=None, base: Config | None = None, *, recipes: Iterable[str] = ("mxfp8_e4m3",),
                 extra_recipes: dict[str, Recipe] | None = None, redraw_every_s: float = 0.5):
        w = _widgets()
        self.store = store
        self.base = base if base is not None else base_config()
        self.redraw_every_s = redraw_every_s
        self._recipes = dict(PRESETS, **(extra_recipes or {}))
        self.runs: list[Run] = []
        self.updates: list[tuple[str, int]] = []
        self._live: dict[str, Run] = {}
        self._drawn_at = 0.0
        b = self.base
        options = [n for n in self._recipes if n != REFERENCE]
        chosen = tuple(recipes)
        bad = [n for n in chosen if n not in options]
        if bad:
            raise ValueError(f"unknown recipe(s) {bad}; valid: {', '.join(options)}")
        self.controls = _controls(w, b, options, chosen)
        self.button = w.Button(description="Train", button_style="primary", icon="play",
                               tooltip="train FP32 and the chosen MX recipes")
        self.button.on_click(self._on_click)
        self.progress = w.IntProgress(value=0, min=0, max=1, description="steps")
        self.status = w.HTML(value="FP32 trains first, then each chosen recipe, on identical data.")
        self.output = w.Output()
        self.figure = Figure(figsize=(11, 6.5), layout="constrained")
        self.axes = self.figure.subplots(2, 2).ravel()
        c = self.controls
        left = w.VBox([c["act"], c["norm"], c["width"], c["depth"]])
        right = w.VBox([c["lr"], c["steps"], c["seed"], c["diagnostics_every"]])
        self.widget = w.VBox([w.HBox([c["recipes"], left, right]), w.HBox([self.button, self.progress]),
                              self.status, self.output])
        self.draw()

    # -- display -------------------------------------------------------------
    def _repr_mimebundle_(self, **kwargs):
        """The widget's bundle, with a one-line note instead of the widget's
        ``VBox(children=...)`` text for viewers that cannot render widgets."""
        bundle = self.widget._repr_mimebundle_(**kwargs)
        if bundle and "text/plain" in bundle:
            bundle["text/plain"] = TEXT_REPR
        return bundle

    def png(self) -> bytes:
        """The current figure as PNG bytes."""
        buf = io.BytesIO()
        self.figure.savefig(buf, format="png", dpi=90)
        return buf.getvalue()

    def snapshot(self):
        """The current figure as an ``IPython.display.Image``: a static copy
        that a saved notebook keeps (widget views need a live kernel)."""
        from IPython.display import Image

        return Image(data=self.png(), format="png")

    def _show(self, force: bool = False) -> None:
        """Redraw the figure and, inside a kernel, show it in :attr:`output`
        (at most every ``redraw_every_s`` seconds unless ``force``)."""
        now = time.perf_counter()
        if not force and now - self._drawn_at < self.redraw_every_s:
            return
        self._drawn_at = now
        self.draw()
        if _in_kernel():
            from IPython.display import clear_output, display

            with self.output:
                clear_output(wait=True)
                display(self.snapshot())

    def draw(self) -> None:
        """Plot :attr:`runs` and the runs training now on :attr:`figure`'s
        panels (FP32 has no ‖ζ‖ or cosine to show: exactly 0 and 1 against
        itself; a norm without gains gets a note instead of a clamp curve)."""
        shown = {r.config.recipe.name: r for r in self.runs}
        shown.update(self._live)
        for ax, (col, label, scale) in zip(self.axes, PANELS):
            ax.clear()
            ax.set_title(label, fontsize=10)
            ax.set_xlabel("step")
            ax.set_yscale(scale)
            drawn = 0
            for name, run in shown.items():
                if col not in run.metrics or (name == REFERENCE and col in ("zeta_bound", "cosine")):
                    continue
                m = run.metrics.dropna(subset=[col])
                if not len(m):
                    continue
                ax.plot(m["step"], m[col], lw=0.9, color=plots.color(name), label=name)
                if run.diverged_at is not None:
                    ax.axvline(run.diverged_at, color=plots.color(name), ls=":", lw=1)
                drawn += 1
            if drawn:
                ax.legend(fontsize=7)
            elif col == "ln_clamp_frac" and shown:
                norm = next(iter(shown.values())).config.norm
                ax.text(0.5, 0.5, f"no LN gains to clamp (norm={norm})", ha="center", va="center",
                        transform=ax.transAxes, fontsize=9, color="0.4")

    # -- training ------------------------------------------------------------
    def configs(self) -> list[Config]:
        """The configs the controls ask for: FP32 first, then each chosen
        recipe, otherwise identical (``val_every`` rounded up to a multiple
        of the diagnostics period, as Config requires).

        Raises:
          ValueError: a control's value a Config rejects (its own message,
            naming the value).
        """
        c = {k: v.value for k, v in self.controls.items()}
        period = int(c["diagnostics_every"])
        common = self.base.replace(act=c["act"], norm=c["norm"], width=int(c["width"]), depth=int(c["depth"]),
                                   lr=float(c["lr"]), steps=int(c["steps"]), seed=int(c["seed"]),
                                   diagnostics_every=period, val_every=_val_every(self.base.val_every, period))
        names = [REFERENCE] + [n for n in c["recipes"] if n != REFERENCE]
        return [common.replace(recipe=self._recipes[n]) for n in names]

    def train(self) -> list[Run]:
        """Train FP32 and every chosen recipe one after another, updating the
        figure and progress bar live; returns the runs (also :attr:`runs`).

        Raises:
          ValueError: a control value a Config rejects (nothing trains).
        """
        configs = self.configs()
        self.runs, self.updates, self._live = [], [], {}
        self.progress.max, self.progress.value = sum(c.steps for c in configs), 0
        self.button.disabled = True
        done = 0
        try:
            for config in configs:
                name = config.recipe.name
                self.status.value = f"training <b>{name}</b> ({config.steps} steps)…"

                def update(step: int, run: Run, name=name, done=done) -> None:
                    self._live[name] = run
                    self.updates.append((name, step))
                    self.progress.value = min(done + step, self.progress.max)
                    self._show()

                self.runs.append(train_live(config, self.store, update))
                self._live.pop(name, None)
                done += config.steps
        finally:
            self.button.disabled = False
            self._live = {}
            self._show(force=True)
        self.status.value = self._summary()
        return list(self.runs)

    def _summary(self) -> str:
        """One HTML line per run: final loss, median ‖ζ‖ bound, divergence, where it is stored."""
        rows = []
        for r in self.runs:
            m = r.metrics
            zeta = m["zeta_bound"].median() if "zeta_bound" in m else float("nan")
            fate = f"diverged at {r.diverged_at}" if r.diverged_at is not None else "stable"
            # the store as it was given (e.g. "../runs"), not this machine's absolute path: the line is saved
            # with a notebook's widget state
            where = (f" — {os.path.join(os.fspath(self.store), os.path.basename(os.fspath(r.path)))}"
                     if r.path and self.store is not None else f" — {r.path}" if r.path else "")
            rows.append(f"<b>{r.config.recipe.name}</b>: final loss {r.final_loss:.4g}, median ‖ζ‖ bound "
                        f"{zeta:.3g}, {fate}{where}")
        return "<br>".join(rows)

    # -- results -------------------------------------------------------------
    def table(self) -> pd.DataFrame:
        """One row per run of the latest training (:attr:`runs`, read now:
        after another press of Train it describes the new runs), indexed by
        recipe, FP32 first: final loss, its ratio to FP32's, median ‖ζ‖
        bound, minimum cosine, maximum LN clamp fraction (NaN where a metric
        was not measured, e.g. no LN gains), first diverged step (NaN if
        stable). Empty (with these columns) before the first training."""
        runs = list(self.runs)
        ref = next((r for r in runs if r.config.recipe.name == REFERENCE), None)

        def stat(m, col, how) -> float:
            return float(getattr(m[col].dropna(), how)()) if col in m and m[col].notna().any() else float("nan")

        rows = []
        for r in runs:
            m = r.metrics
            rows.append(dict(recipe=r.config.recipe.name, final_loss=r.final_loss,
                             vs_fp32=r.final_loss / ref.final_loss if ref is not None else float("nan"),
                             zeta_median=stat(m, "zeta_bound", "median"), cosine_min=stat(m, "cosine", "min"),
                             ln_clamp_max=stat(m, "ln_clamp_frac", "max"),
                             diverged_at=float("nan") if r.diverged_at is None else float(r.diverged_at)))
        return pd.DataFrame(rows, columns=("recipe",) + TABLE_COLUMNS).set_index("recipe")

    def conclusions(self) -> str:
        """Markdown: the settings of the latest training (:attr:`runs`, read
        now) and one sentence per MX run, computed from :meth:`table`."""
        if not self.runs:
            return "Nothing trained yet: press **Train** (or call `panel.train()`), then rerun this cell."
        table = self.table()
        c = self.runs[0].config
        lines = [f"Width {c.width}, depth {c.depth}, activation {c.act}, norm {c.norm}, LR {c.lr:g}, seed {c.seed}, "
                 f"{c.steps} steps:"]
        for name, t in table.drop(index=REFERENCE, errors="ignore").iterrows():
            fate = f"diverged at step {t.diverged_at:.0f}" if pd.notna(t.diverged_at) else "stayed stable"
            clamp = ("no LN gains to clamp" if pd.isna(t.ln_clamp_max)
                     else f"at most {100 * t.ln_clamp_max:.0f}% of the LN gains clamped")
            lines.append(f"- **{name}** {fate}; its final loss is {t.vs_fp32:.3g}× FP32's, its median ‖ζ‖ bound "
                         f"{t.zeta_median:.3g} (minimum cosine {t.cosine_min:.3g}), {clamp}.")
        return "\n".join(lines)

    def _on_click(self, _button) -> None:
        """The Train button: like :meth:`train`, but a rejected value is shown in the status line."""
        try:
            self.train()
        except ValueError as err:
            self.status.value = f"<span style='color:#b00'>not trained: {err}</span>"


def explore(store=None, **defaults) -> Explorer:
    """A live explorer panel (see :mod:`mx_proxy.viz.explore`).

    Args:
      store: a run-store folder where runs land (and are loaded from when
        already there), or ``None`` (memory only).
      **defaults: Config fields for the base config (the quick scale's) and
        the controls' initial values; ``recipe`` may be a preset name, a
        :class:`Recipe` or a sequence of them (the initially chosen MX
        recipes; default ``mxfp8_e4m3``).

    Returns:
      An :class:`Explorer`; display it (last expression of a cell) and press
      Train, or call its :meth:`~Explorer.train`.

    Raises:
      ValueError: an unknown Config field (naming the valid ones) or a bad value.
      ImportError: ipywidgets is not installed.
    """
    recipe = defaults.pop("recipe", "mxfp8_e4m3")
    chosen, extra = _recipe_defaults(recipe)
    return Explorer(store, base_config(**defaults), recipes=chosen, extra_recipes=extra)
