"""Running: the one host loop over a member axis (``train``, ``sweep``, ``load``) and interventions.

It sits above :mod:`mx_proxy.store` because it writes runs and checkpoints there.
"""
