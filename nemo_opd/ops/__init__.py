"""Triton kernels, one file each with its host code and autograd.Function.

Modules here import triton; import them lazily (nemo_opd.losses does) so that a CPU process
can still choose to run them in Triton's interpreter (TRITON_INTERPRET=1 before the import).
"""
