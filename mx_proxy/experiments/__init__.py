"""Experiments: named scales, the paper's and seed 003's experiment lists, the headline campaign, tables of runs, the scale search.
"""
