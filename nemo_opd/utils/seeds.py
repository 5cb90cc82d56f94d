"""Sampling seeds: one derivation for every generation request a run makes.

A call's seed (`call_seed`) is a 63-bit hash of (the run's distillation.seed, what the call is
for, its index: the step, or 0 for validation), so two steps, or a step and validation, start
from unrelated places whatever their sizes. Inside a call, row r (prompt p's sample j: r =
p x copies + j) at turn t (0-based) samples with `request_seed(call, r, t)` = call + r x
TURNS_PER_ROW + t (modulo 2**63): no two requests of a call share a seed at any size, and the
low 32 bits (all that a CPU generator, torch's mt19937, reads of a seed) differ too while a
call has fewer than 2**22 rows. Requests of different calls share a seed only if their calls'
hashes fall within one row span of each other: about one chance in 2**63 / (4 x rows x turns)
per pair of calls at full width (a GPU's generator reads all 64 bits).

The sum is additive, request_seed(request_seed(call, f, 0), i, t) == request_seed(call, f + i,
t): a part of a batch seeded with the seed of its first row samples every row as the whole
batch would. hashlib, not hash(): the same on every process, platform and Python run.
"""

import hashlib

SEED_BITS = 63
"""Seeds are below 2**63: an int64 anywhere (torch's manual_seed, numpy, vLLM's params)."""
TURNS_PER_ROW = 1024
"""Seeds a row holds apart for its turns: distillation.max_rollout_turns is at most this."""


def call_seed(run_seed: int, purpose: str, index: int) -> int:
    """The seed of one generation call of a run: a hash of (run_seed, purpose, index), e.g.
    (distillation.seed, "step", step) or (distillation.seed, "validation", 0)."""
    key = f"nemo_opd-sampling:{purpose}:{run_seed}:{index}".encode()
    digest = hashlib.blake2b(key, digest_size=8).digest()
    return int.from_bytes(digest, "little") % (1 << SEED_BITS)


def request_seed(seed: int, row: int, turn: int) -> int:
    """The sampling seed of row `row` (its index in the call) at turn `turn` (0-based) of a
    call seeded `seed` (module docstring)."""
    if not 0 <= turn < TURNS_PER_ROW:
        raise ValueError(f"turn {turn}: a row has at most {TURNS_PER_ROW} turns")
    return (seed + row * TURNS_PER_ROW + turn) % (1 << SEED_BITS)
