"""Figures: one function per figure (``plots``), the figures command's generator, the live explorer.
"""
