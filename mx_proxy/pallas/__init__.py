"""Pallas kernels for block-scaled (MX) matmuls: quantize, operand and GEMM kernels, each beside its
plain-JAX reference; backend choice, tuning, compile checks (see ``README.md`` here).

The kernels import only :mod:`mx_proxy.numerics`.
"""
