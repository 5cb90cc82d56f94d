"""Triton kernels, one file each with its host code. Their autograd wrapper is shared with the
plain-torch twins and lives beside the functional API (nemo_opd/losses/topk_kl.py).

Modules here import triton; import them lazily (nemo_opd.losses does) so that a CPU process
can still choose to run them in Triton's interpreter (TRITON_INTERPRET=1 before the import).
"""
