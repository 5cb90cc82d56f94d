"""Converting other frameworks' configs into nemo_opd's.

    python -m nemo_opd.convert nemo-rl CONFIG.yaml -o OUT.yaml

Modules: nemo_rl.py (a NeMo-RL distillation config -> a nemo_opd config, key by key, from the
key map nemo_opd.nemo_rl_keys, which config's error messages read too and so stands below
both), nemo_rl_builder.py (the conversion in progress and its rows), nemo_rl_sections.py (the
sections that change shape: optimizer, scheduler, data, validation, checkpoint ranking),
nemo_rl_schedule.py (the learning-rate schedules), report.py (the printed table), __main__.py
(the command line). docs/nemo_rl.md is the user's page.
"""
