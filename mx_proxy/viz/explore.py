"""A live explorer: an ipywidgets panel that trains FP32 and MX runs and plots them as they train.

In a notebook cell::

    import mx_proxy as mxp
    panel = mxp.explore(store="runs", width=64, steps=1000)   # any Config field as a default
    panel                                                        # shows the panel; press Train

or headless, the same as pressing Train but in this thread::

    panel.controls["recipes"].value = ("mxfp8_e4m3", "mxfp6_e2m3")
    panel.controls["norm"].value = "rmsnorm"
    runs = panel.train()          # [fp32, mxfp8_e4m3, mxfp6_e2m3] Runs; also panel.runs
    panel.snapshot()              # the live figure as a static PNG (for a saved notebook)
    panel.table()                 # one row per run of the latest training (the panel shows it too)
    panel.conclusions()           # the same as Markdown sentences

The controls are the recipes (several may be chosen; FP32 is always trained
first, with the same seeds and therefore the same initial weights, batches
and batch order), activation, normalization, width, depth, learning rate,
steps, seed and diagnostics period; everything else comes from the base
config (the quick scale's, changed by the keyword defaults). A number that
is not valid (width −5, steps 0, width "wide") is not clamped to one that
is: Train refuses it with a message naming the field and its valid range
(:mod:`mx_proxy.viz.explore_controls`).

The Train button trains in a thread of its own, so the kernel stays free:
the Stop button (or Kernel → Interrupt while no cell runs) stops the
training at the end of the current segment, keeps the runs that finished
and checkpoints the one training (in the store; Train again resumes it),
and the status line says what was kept. :meth:`Explorer.train`, called from
a cell, trains in the cell's thread; Kernel → Interrupt stops it the same
way and raises :class:`mx_proxy.runner.interrupt.Interrupted` (one line,
no traceback). While a program of a new shape compiles the status line says
so, with the seconds the last new shape took (measured, kept beside the
compilation cache); then the progress bar runs. The figure (training loss,
‖ζ‖ bound, cosine between the MX and the FP32 gradient at the same weights,
fraction of LN gains the MX scale clamps) updates after every segment of the
host loop (every ``val_every`` steps), and the results under it (the table
of :meth:`Explorer.table` and the sentences of :meth:`Explorer.conclusions`)
after every run. Results land in ``store`` when one is given (a config
already there is loaded, not retrained) and are kept in ``panel.runs``.

Training goes through :func:`train_live`, the one place this module meets
the runner.
"""

from __future__ import annotations

import base64
import contextvars
import io
import threading
import time
from collections.abc import Iterable

import pandas as pd
from matplotlib.figure import Figure

from mx_proxy.experiments import scales
from mx_proxy.numerics.recipe import PRESETS, Recipe
from mx_proxy.runner import interrupt, programs
from mx_proxy.store import executables
from mx_proxy.training.config import Config
from mx_proxy.training.engine import static_key
from mx_proxy.training.result import Run
from mx_proxy.viz import explore_results as _results
from mx_proxy.viz.explore_controls import CONTROLS, CompileTimes, make_controls, read_controls, val_every
from mx_proxy.viz.explore_results import PANELS, REFERENCE, TABLE_COLUMNS, draw_panel, panels  # noqa: F401 (API)
from mx_proxy.viz.explore_training import interrupt_on_sigint, train_live

__all__ = ["explore", "Explorer", "train_live", "base_config", "PANELS", "CONTROLS"]

# what the panel shows where its widget cannot render (a saved notebook on a viewer without widgets)
TEXT_REPR = "mxp.explore() panel (a live widget: it shows while the notebook's kernel runs)"


def base_config(**defaults) -> Config:
    """The quick scale's config (``mx_proxy.experiments.scales.get("quick").config``) with
    ``defaults`` (Config fields) applied.

    Raises:
      ValueError: an unknown field (naming the valid ones) or a bad value.
    """
    return scales.get("quick").config.replace(**defaults)


def _widgets():
    try:
        import ipywidgets
    except ImportError as err:  # an optional dependency: say how to get it
        raise ImportError("mxp.explore needs ipywidgets: pip install 'mx-proxy[notebooks]' (or pip install "
                          "ipywidgets)") from err
    return ipywidgets


def _error(text: str) -> str:
    return f"<span style='color:#b00'>{text}</span>"


class Explorer:
    """The explorer panel (see the module docstring). Display it in a
    notebook (it renders as its widget, :attr:`widget`); drive it with
    :attr:`controls` and :meth:`train`.

    Attributes:
      controls: ``{name: widget}`` for :data:`CONTROLS`.
      button, stop_button, progress, status, output, results: the Train and
        Stop buttons, the progress bar (steps of all runs of one training),
        an HTML status line, the Output the live figure is shown in and the
        HTML results under it (table and sentences of the latest training).
      figure: the live ``matplotlib.figure.Figure`` (one panel per :data:`PANELS`, and with ``quant_stats``
        the GEMM operands' worst SNR and underflow).
      runs: the :class:`Run` s of the last training, FP32 first (those that
        finished, after a stop).
      updates: ``(recipe name, step)`` of every live update of the last training.
      store: where runs land (``None``: memory only).
      compile_times: the :class:`~mx_proxy.viz.explore_controls.CompileTimes` the compiling note reads.
    """

    def __init__(self, store=None, base: Config | None = None, *, recipes: Iterable[str] = ("mxfp8_e4m3",),
                 extra_recipes: dict[str, Recipe] | None = None, redraw_every_s: float = 0.5,
                 compile_times: CompileTimes | None = None):
        w = _widgets()
        self.store = store
        self.base = base if base is not None else base_config()
        self.redraw_every_s = redraw_every_s
        self.compile_times = compile_times or CompileTimes()
        self._recipes = dict(PRESETS, **(extra_recipes or {}))
        self.runs: list[Run] = []
        self.updates: list[tuple[str, int]] = []
        self._live: dict[str, Run] = {}
        self._drawn_at = 0.0
        self._lock = threading.RLock()  # the figure: drawn by the training thread, read by snapshot()
        self._thread: threading.Thread | None = None
        self._interruption: interrupt.Interruption | None = None
        options = [n for n in self._recipes if n != REFERENCE]
        chosen = tuple(recipes)
        bad = [n for n in chosen if n not in options]
        if bad:
            raise ValueError(f"unknown recipe(s) {bad}; valid: {', '.join(options)}")
        self.controls = make_controls(w, self.base, options, chosen)
        self.button = w.Button(description="Train", button_style="primary", icon="play",
                               tooltip="train FP32 and the chosen MX recipes")
        self.stop_button = w.Button(description="Stop", icon="stop", disabled=True,
                                    tooltip="stop at the end of the current segment, keeping what finished "
                                            "(as Kernel → Interrupt does)")
        self.button.on_click(self._on_click)
        self.stop_button.on_click(lambda _b: self.stop())
        self.progress = w.IntProgress(value=0, min=0, max=1, description="steps")
        self.status = w.HTML(value="FP32 trains first, then each chosen recipe, on identical data.")
        self.output = w.Output()
        self.results = w.HTML(value="")
        self.figure = Figure(figsize=(11, 6.5), layout="constrained")
        self.axes = self.figure.subplots(2, len(panels(self.base)) // 2).ravel()
        c = self.controls
        for name in CONTROLS:
            c[name].observe(self._on_change, names="value")
        left = w.VBox([c["act"], c["norm"], c["width"], c["depth"]])
        right = w.VBox([c["lr"], c["steps"], c["seed"], c["diagnostics_every"]])
        self.widget = w.VBox([w.HBox([c["recipes"], left, right]), w.HBox([self.button, self.stop_button,
                                                                            self.progress]),
                              self.status, self.output, self.results])
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
        with self._lock:
            self.figure.savefig(buf, format="png", dpi=90)
        return buf.getvalue()

    def snapshot(self):
        """The current figure as an ``IPython.display.Image``: a static copy
        that a saved notebook keeps (widget views need a live kernel)."""
        from IPython.display import Image

        return Image(data=self.png(), format="png")

    def _show(self, force: bool = False) -> None:
        """Redraw the figure and show it in :attr:`output` (at most every
        ``redraw_every_s`` seconds unless ``force``). The Output's outputs are
        set directly, from whichever thread trains."""
        now = time.perf_counter()
        if not force and now - self._drawn_at < self.redraw_every_s:
            return
        self._drawn_at = now
        with self._lock:
            self.draw()
            png = base64.b64encode(self.png()).decode()
        self.output.outputs = ({"output_type": "display_data", "metadata": {},
                                "data": {"image/png": png, "text/plain": "<the explorer's figure>"}},)

    def draw(self) -> None:
        """Plot :attr:`runs` and the runs training now on :attr:`figure`'s
        panels (FP32 has no ‖ζ‖ or cosine to show: exactly 0 and 1 against
        itself; a norm without gains gets a note instead of a clamp curve)."""
        shown = {r.config.recipe.name: r for r in self.runs}
        shown.update(self._live)
        with self._lock:
            for ax, (col, label, scale) in zip(self.axes, panels(self.base)):
                draw_panel(ax, shown, col, label, scale)
            _results.legend(self.figure)

    # -- training ------------------------------------------------------------
    def configs(self) -> list[Config]:
        """The configs the controls ask for: FP32 first, then each chosen
        recipe, otherwise identical (``val_every`` rounded up to a multiple
        of the diagnostics period, as Config requires).

        Raises:
          ValueError: a control's value that is not valid (naming the field
            and its valid range), or one a Config rejects (its own message).
        """
        c = read_controls(self.controls)
        period = c["diagnostics_every"]
        common = self.base.replace(act=c["act"], norm=c["norm"], width=c["width"], depth=c["depth"], lr=c["lr"],
                                   steps=c["steps"], seed=c["seed"], diagnostics_every=period,
                                   val_every=val_every(self.base.val_every, period))
        names = [REFERENCE] + [n for n in c["recipes"] if n != REFERENCE]
        return [common.replace(recipe=self._recipes[n]) for n in names]

    @property
    def training(self) -> bool:
        """Whether the Train button's training is running (in its thread)."""
        return self._thread is not None and self._thread.is_alive()

    def train(self) -> list[Run]:
        """Train FP32 and every chosen recipe one after another, in this
        thread, updating the figure, progress bar and results live; returns
        the runs (also :attr:`runs`).

        Raises:
          ValueError: a control value that is not valid (nothing trains).
          mx_proxy.runner.interrupt.Interrupted: stopped (Kernel → Interrupt,
            Ctrl-C, :meth:`stop`); :attr:`runs` holds those that finished.
        """
        configs = self.configs()
        if self.training:
            raise RuntimeError("the panel is training already (its Train button): panel.stop() or panel.wait()")
        return self._run(configs, interrupt.Interruption())

    def stop(self) -> None:
        """Stop the training at the end of its current segment (the Stop button)."""
        if self._interruption is not None:
            self._interruption.request()
            self.status.value = "stopping at the end of the current segment…"

    def wait(self, timeout: float | None = None) -> bool:
        """Wait for the Train button's training to end; False if it still runs after ``timeout`` seconds."""
        if self._thread is not None:
            self._thread.join(timeout)
        return not self.training

    def _run(self, configs: list[Config], interruption: interrupt.Interruption) -> list[Run]:
        self.runs, self.updates, self._live = [], [], {}
        self._interruption = interruption
        self.progress.max, self.progress.value = sum(c.steps for c in configs), 0
        self.button.disabled, self.stop_button.disabled = True, False
        done = 0
        try:
            with interrupt.interruptible(interruption):
                for config in configs:
                    self.runs.append(self._train_one(config, done))
                    self._live.pop(config.recipe.name, None)
                    if not any(r is self.runs[-1] for r in interruption.finished):  # a run loaded, not trained
                        interruption.finish(self.runs[-1])
                    done += config.steps
                    self._show_results()
        except interrupt.Interrupted as err:
            self.status.value = f"stopped: {err}. Press Train to go on (finished runs load, the stopped one resumes)."
            raise
        finally:
            self._interruption = None
            self.button.disabled, self.stop_button.disabled = False, True
            self._live = {}
            self._show(force=True)
            self._show_results()
        self.status.value = _results.summary_html(self.runs, self.store)
        return list(self.runs)

    def _train_one(self, config: Config, done: int) -> Run:
        """One run: the compiling note while its program is new to this process, then live updates."""
        name = config.recipe.name
        key = static_key(config)
        shape = key.hash()
        fresh = not programs.single(key)[0].ready
        if fresh:
            expected = self.compile_times.expected(shape)
            self.status.value = (f"<b>{name}</b>: compiling (first run of this shape, "
                                 + (f"~{expected:.0f} s measured last time)…" if expected is not None
                                    else "not measured before)…"))
        else:
            self.status.value = f"training <b>{name}</b> ({config.steps} steps)…"
        t0, compiled = time.perf_counter(), executables.stats["compiled"]
        first = [True]

        def update(step: int, run: Run) -> None:
            if first[0]:
                first[0] = False
                if fresh and executables.stats["compiled"] > compiled:
                    self.compile_times.record(shape, time.perf_counter() - t0)
                self.status.value = f"training <b>{name}</b> ({config.steps} steps)…"
            self._live[name] = run
            self.updates.append((name, step))
            self.progress.value = min(done + step, self.progress.max)
            self._show()

        return train_live(config, self.store, update)

    def _show_results(self) -> None:
        """The results under the figure: :meth:`table` and :meth:`conclusions` of :attr:`runs`."""
        self.results.value = _results.results_html(self.runs)

    # -- results -------------------------------------------------------------
    def table(self) -> pd.DataFrame:
        """One row per run of the latest training (:attr:`runs`, read now),
        indexed by recipe, FP32 first (:func:`mx_proxy.viz.explore_results.table`):
        final loss, its ratio to FP32's, median ‖ζ‖ bound, minimum cosine,
        maximum LN clamp fraction, first diverged step. Empty before the
        first training. The panel shows it under its figure after every run."""
        return _results.table(self.runs)

    def conclusions(self) -> str:
        """Markdown: the settings of the latest training (:attr:`runs`, read
        now) and one sentence per MX run, computed from :meth:`table`."""
        return _results.conclusions(self.runs)

    # -- the buttons ---------------------------------------------------------
    def _on_change(self, change) -> None:
        """A control changed: say at once when its value is not valid."""
        if self.training:
            return
        try:
            self.configs()
        except ValueError as err:
            self.status.value = _error(f"{err}: fix it to train")
        else:
            if "color:#b00" in self.status.value:
                self.status.value = "Press Train."

    def _on_click(self, _button) -> None:
        """The Train button: :meth:`train` in a thread of its own (the kernel stays free, so the Stop button
        and Kernel → Interrupt reach it); a value that is not valid is shown in the status line instead."""
        if self.training:
            return
        try:
            configs = self.configs()
        except ValueError as err:
            self.status.value = _error(f"not trained: {err}")
            return
        interruption = interrupt.Interruption()
        restore = interrupt_on_sigint(interruption)

        def work():
            try:
                self._run(configs, interruption)
            except interrupt.Interrupted:
                pass  # the status line says what was kept
            except Exception as err:  # noqa: BLE001 -- shown where the reader looks, not lost in a thread
                self.status.value = _error(f"training failed: {type(err).__name__}: {err}")
            finally:
                restore()

        self._thread = threading.Thread(target=contextvars.copy_context().run, args=(work,), daemon=True,
                                        name="mx_proxy explorer")
        self._thread.start()


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
    chosen, extra = _results.recipe_defaults(recipe)
    return Explorer(store, base_config(**defaults), recipes=chosen, extra_recipes=extra)
