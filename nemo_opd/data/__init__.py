"""Datasets and data helpers (prompts, chat rendering, message logs, batching, packing).

``tiny_math`` as a dataset name is the synthetic task of the embedded default (nemo_opd/tiny/)."""
