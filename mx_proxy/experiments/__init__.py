"""Experiments: named scales, the paper's experiment lists and the systems (GNMR, 2-D FP4, NVFP4, nGPT), the
headline campaign, tables of runs, the scale search.
"""
