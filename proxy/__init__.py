"""proxy: a workbench for training instabilities in microscaling (MX) formats.

The public API a notebook sees::

    import proxy
    cfg = proxy.Config(width=128, depth=4, lr=1e-3, steps=3000, recipe="mxfp8_e4m3")
    fp32, mx = proxy.train(cfg.replace(recipe="fp32")), proxy.train(cfg, store="runs")  # store: optional folder
    mx.metrics        # pandas DataFrame: step, loss, grad_norm, zeta_bound, cosine, ln_clamp_frac, ...
    mx.diverged_at    # step or None
    sw = proxy.sweep(cfg, lr=[1e-4, 3e-4, 1e-3], seed=[0, 1], recipe=["fp32", "mxfp8_mixed"])
    saved = proxy.intervene(mx, at_step=1500, apply="ln_exempt")   # names: proxy.MITIGATIONS

    spec = proxy.MXSpec("fp8_e4m3")           # block 32, OCP floor scale, ties to even
    q = proxy.quantize(x, spec, axis=-1)       # float32 values on the MX grid
    s = proxy.quantize_stats(x, spec)          # clamped / last-bin / flushed fractions

    # beyond the paper: 2-D tiles, NVFP4, nGPT, the GNMR controller
    proxy.train(cfg.replace(recipe="mxfp4_2d"))                     # or "mxfp8_2d", "nvfp4", "nvfp4_2d"
    proxy.train(cfg.replace(arch="ngpt", recipe="nvfp4"))
    run = proxy.train(cfg.replace(controller=proxy.GNMR(threshold=3.0, lock_steps=50, action="bf16")))
    run.events                                 # promotions and releases; metrics["low_precision_frac"]

    panel = proxy.explore(width=64, steps=1000)   # live ipywidgets panel: pick recipes, act, norm, LR…; Train

Importing proxy turns on JAX's persistent compilation cache (a user cache
folder; ``PROXY_COMPILE_CACHE=off`` opts out, a path moves it): see
:mod:`proxy.compile_cache`.
"""

from proxy import compile_cache
from proxy import formats
from proxy import recipe as recipes
from proxy.config import Config
from proxy.controllers import GNMR
from proxy.explore import explore
from proxy.formats import ElementFormat
from proxy.quantize import NVFP4, MXSpec, QuantStats, quantize, quantize_stats
from proxy.recipe import MITIGATIONS, Recipe, mitigate
from proxy.run import Run
from proxy.interventions import intervene
from proxy.runner import load, sweep, train
from proxy.sweeps import Sweep
from proxy.version import __version__

compile_cache.enable()  # before anything compiles; PROXY_COMPILE_CACHE=off opts out

__all__ = ["formats", "recipes", "Config", "ElementFormat", "GNMR", "explore", "MITIGATIONS", "MXSpec", "NVFP4", "QuantStats",
           "Recipe", "Run", "Sweep", "intervene", "load", "mitigate", "quantize", "quantize_stats", "sweep", "train",
           "__version__"]
