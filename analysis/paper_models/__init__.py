"""Analytic performance models from the papers, one module per paper.

Each module turns a profile (per-layer compute times, layer sizes), a bandwidth and a
cluster size into the paper's predicted times, with the paper's equation numbers in the
docstrings, so that experiments can put prediction next to measurement.
"""
