"""Networks: the MX dense layer (custom VJP), norms and activations, blocks, the residual-MLP and nGPT students,
the frozen teacher.
"""
