"""On-policy distillation on math: the student samples, the teacher grades every token.

    python examples/run_distillation_math.py --config examples/configs/distillation_tiny.yaml
    python examples/run_distillation_math.py --config CONFIG.yaml --print-config loss_fn.kl_type=jsd

All the logic lives in nemo_opd.cli and nemo_opd.config; see docs/config.md for every key.
"""

from nemo_opd.cli import main
from nemo_opd.utils.quick_exit import quick_exit

if __name__ == "__main__":
    quick_exit(main(description=__doc__.splitlines()[0]))
