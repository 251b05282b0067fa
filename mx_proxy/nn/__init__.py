"""Networks: the MX dense layer (custom VJP), norms and activations, initializers, the model spec every student and
block reads, blocks, the residual-MLP and nGPT students, the frozen teacher.
"""
