"""A NeMo-RL distillation config -> a nemo_opd config, with a row per NeMo-RL key saying what it
became.

    conversion = convert_nemo_rl("examples/configs/distillation_math.yaml")
    conversion.config   # nemo_opd's config as a plain dict
    conversion.rows     # one Row per NeMo-RL key: its kind, key and value there and here, why

The steps, in order:
1. read the file as NeMo-RL reads it: anchors and merge keys, `defaults:` relative to the file,
   and NeMo-RL's own defaults for the loop and loss keys a file leaves out; its
   interpolations resolved for the values;
2. the sections that change shape (nemo_rl_sections.py): optimizer and schedule, data and
   validation, the loss's tail, checkpoint ranking, values not supported here yet;
3. every other key by the key map (nemo_opd.nemo_rl_keys): a same or renamed key keeps
   its value (an interpolation stays as written when every key it names is the same here), a
   changed key goes to the nearest key here with its note, a dropped key is listed with why;
4. what needs the whole config: a checkpoint ranking by a validation metric saves when
   validation runs.
"""

from pathlib import Path
from typing import Any

from nemo_opd.config.interpolation import resolve_interpolations
from nemo_opd.config.loader import deep_merge, load_with_defaults
from nemo_opd.convert.nemo_rl_builder import Builder, Conversion, leaves
from nemo_opd.convert.nemo_rl_sections import FINISHERS, SECTION_CONVERTERS

NEMO_RL_DEFAULTS: dict[str, Any] = {
    "distillation": {
        "num_prompts_per_step": 128,
        "num_generations_per_prompt": 1,
        "max_rollout_turns": 1,
        "max_num_steps": 1000,
        "max_num_epochs": 10,
        "val_batch_size": 64,
        "val_period": 20,
        "val_at_start": False,
        "val_at_end": False,
        "max_val_samples": 512,
        "topk_logits_k": 64,
        "seed": 42,
    },
    "loss_fn": {"kl_type": "mixed", "mixed_kl_weight": 0.5, "zero_outside_topk": False},
}
"""NeMo-RL's defaults for the keys of its distillation loop and loss (where they differ from
ours, a file that leaves them out means NeMo-RL's)."""


def convert_nemo_rl(path: str | Path) -> Conversion:
    """Convert the NeMo-RL distillation config at `path` (see the module docstring). Raises
    ConfigError when it cannot be read (missing, bad YAML, an interpolation that fails)."""
    # 1. read it as NeMo-RL does
    raw = deep_merge(NEMO_RL_DEFAULTS, load_with_defaults(path))
    builder = Builder(Path(path), raw, resolve_interpolations(raw))
    # 2. the sections that change shape
    for convert in SECTION_CONVERTERS:
        convert(builder)
    # 3. every other key by the key map
    for source, _ in leaves(raw):
        if not builder.is_done(source):
            builder.by_key_map(source)
    # 4. what needs the whole config
    for finish in FINISHERS:
        finish(builder)
    return builder.result()
