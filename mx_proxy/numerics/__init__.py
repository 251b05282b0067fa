"""Numbers: element formats, the MX bit arithmetic (``mx/``), ``quantize``, recipes, the float64 reference.

Importing this layer is light: no matplotlib, no compilation-cache switch.
"""
