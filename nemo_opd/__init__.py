"""nemo_opd: on-policy distillation of language models."""

__version__ = "0.1.0"
