"""Datasets and data helpers. ``tiny_math`` is the synthetic task of the embedded default."""
