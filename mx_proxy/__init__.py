"""mx_proxy: a workbench for training instabilities in microscaling (MX) formats.

The public API a notebook sees::

    import mx_proxy as mxp
    cfg = mxp.Config(width=128, depth=4, lr=1e-3, steps=3000, recipe="mxfp8_e4m3")
    fp32, mx = mxp.train(cfg.replace(recipe="fp32")), mxp.train(cfg, store="runs")  # store: optional folder
    mx.metrics        # pandas DataFrame: step, loss, grad_norm, zeta_bound, cosine, ln_clamp_frac, ...
    mx.diverged_at    # step or None
    sw = mxp.sweep(cfg, lr=[1e-4, 3e-4, 1e-3], seed=[0, 1], recipe=["fp32", "mxfp8_mixed"])
    saved = mxp.intervene(mx, at_step=1500, apply="ln_exempt")   # names: mxp.MITIGATIONS

    # a rate, not a trajectory: 16 replicas per arm branched at step 1500, each arm seeing the same perturbations
    ens = mxp.ensemble(mx_run_in_a_store, branch_at=1500, members=16, arms=["unchanged", "fp32", "rceil"], horizon=1000)
    ens.rates()                   # P(blow-up) per arm, Clopper–Pearson 95 % intervals;
                                  # ens.paired_tests(), ens.survival(arm)
    mxp.plots.survival(ens)       # Kaplan–Meier curves per arm with their bands
    both = mxp.pool_ensembles([mxp.load_ensemble(a), mxp.load_ensemble(b)])  # seeds 1–8 and 9–16 as one ensemble
    mxp.power.pairs_needed(0.125, 0.375)   # 53: the pairs McNemar's test needs to tell 1 in 8 from 3 in 8 (80 %)

    spec = mxp.MXSpec("fp8_e4m3")           # block 32, OCP floor scale, ties to even
    q = mxp.quantize(x, spec, axis=-1)       # float32 values on the MX grid
    s = mxp.quantize_stats(x, spec)          # clamped / last-bin / flushed fractions

    # the systems: 2-D tiles, NVFP4, nGPT, the GNMR controller
    mxp.train(cfg.replace(recipe="mxfp4_2d"))                     # or "mxfp8_2d", "nvfp4", "nvfp4_2d"
    mxp.train(cfg.replace(arch="ngpt", recipe="nvfp4"))
    run = mxp.train(cfg.replace(controller=mxp.GNMR(threshold=3.0, lock_steps=50, action="bf16")))
    run.events                                 # promotions and releases; metrics["low_precision_frac"]

    panel = mxp.explore(width=64, steps=1000)   # live ipywidgets panel: pick recipes, act, norm, LR…; Train
    with mxp.track("tensorboard", "runs/tensorboard"):   # or "mlflow": every run trained inside streams its metrics
        mxp.sweep(cfg, lr=[1e-4, 1e-3])

Every public name is resolved when first used (PEP 562), so ``import mx_proxy.numerics`` stays
light: no matplotlib, no training code, and JAX's persistent compilation cache is left alone.
The cache is turned on by importing the training layer (:mod:`mx_proxy.training`), which
``mxp.train``, ``mxp.sweep``, ``mxp.intervene`` and ``mxp.load`` do before anything compiles.
"""

import importlib

from mx_proxy.version import __version__

# public name -> (module, attribute; None: the module itself), imported on first use
_LAZY = {
    'formats': ('mx_proxy.numerics.formats', None),
    'recipes': ('mx_proxy.numerics.recipe', None),
    'Config': ('mx_proxy.training.config', 'Config'),
    'ElementFormat': ('mx_proxy.numerics.formats', 'ElementFormat'),
    'GNMR': ('mx_proxy.training.controllers', 'GNMR'),
    'explore': ('mx_proxy.viz.explore', 'explore'),
    'ensemble': ('mx_proxy.experiments.ensemble_train', 'ensemble'),
    'load_ensemble': ('mx_proxy.experiments.ensemble_result', 'load'),
    'pool_ensembles': ('mx_proxy.experiments.ensemble_pool', 'pool'),
    'Ensemble': ('mx_proxy.experiments.ensemble', 'Ensemble'),
    'MITIGATIONS': ('mx_proxy.numerics.recipe', 'MITIGATIONS'),
    'MXSpec': ('mx_proxy.numerics.quantize', 'MXSpec'),
    'NVFP4': ('mx_proxy.numerics.quantize', 'NVFP4'),
    'QuantStats': ('mx_proxy.numerics.quantize', 'QuantStats'),
    'Recipe': ('mx_proxy.numerics.recipe', 'Recipe'),
    'Run': ('mx_proxy.training.result', 'Run'),
    'Sweep': ('mx_proxy.training.sweeps', 'Sweep'),
    'intervene': ('mx_proxy.runner.interventions', 'intervene'),
    'load': ('mx_proxy.runner.loop', 'load'),
    'mitigate': ('mx_proxy.numerics.recipe', 'mitigate'),
    'quantize': ('mx_proxy.numerics.quantize', 'quantize'),
    'quantize_stats': ('mx_proxy.numerics.quantize', 'quantize_stats'),
    'sweep': ('mx_proxy.runner.loop', 'sweep'),
    'train': ('mx_proxy.runner.loop', 'train'),
    'with_checkpoint': ('mx_proxy.runner.interventions', 'with_checkpoint'),
    'plots': ('mx_proxy.viz.plots', None),
    'power': ('mx_proxy.experiments.power', None),
    'track': ('mx_proxy.experiments.tracking', 'track'),
}

__all__ = ['formats', 'recipes', 'Config', 'ElementFormat', 'GNMR', 'explore', 'ensemble', 'load_ensemble',
           'pool_ensembles', 'Ensemble',
           'MITIGATIONS', 'MXSpec', 'NVFP4', 'QuantStats', 'Recipe', 'Run', 'Sweep', 'intervene', 'load', 'mitigate',
           'quantize', 'quantize_stats', 'sweep', 'train', 'with_checkpoint', 'plots', 'power', 'track', '__version__']


def __getattr__(name: str):
    try:
        module, attr = _LAZY[name]
    except KeyError:
        raise AttributeError(f"module 'mx_proxy' has no attribute {name!r}") from None
    value = importlib.import_module(module)
    if attr is not None:
        value = getattr(value, attr)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_LAZY))
