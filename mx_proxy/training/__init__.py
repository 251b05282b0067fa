"""Training: ``Config``, data, the engine (jitted step, segments of steps in one loop), diagnostics,
controllers, ``Run`` and ``Sweep``.

Importing this layer turns on JAX's persistent compilation cache
(:mod:`mx_proxy.training.compile_cache`; ``PROXY_COMPILE_CACHE=off`` opts out, a path moves it),
before anything here compiles: ``mxp.train``, ``mxp.sweep`` and every training entry point import
it. Importing :mod:`mx_proxy.numerics`, :mod:`mx_proxy.pallas` or :mod:`mx_proxy.nn` leaves JAX's
configuration alone.
"""

from mx_proxy.training import compile_cache

compile_cache.enable()  # before anything compiles; PROXY_COMPILE_CACHE=off opts out
