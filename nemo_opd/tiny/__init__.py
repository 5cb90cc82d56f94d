"""The embedded tiny task: synthetic arithmetic problems, a locally trained tokenizer, and a
tiny Qwen3 teacher and student trained on them, shipped prebuilt and cached.

- task.py: the arithmetic problems (train and held-out splits, JSONL);
- tokenizer.py, model.py, recipe.py: the tokenizer, the model builder, and the recipe whose
  hash keys the cache;
- sft.py, evaluation.py, build.py: supervised training, held-out accuracy, one whole build;
- prebuilt.py, prebuilt/: the shipped copy of the default build, checked by SHA-256;
- assets.py: the cache, and ``resolve_pretrained("tiny:teacher")`` -> a local directory.

Command line: ``python -m nemo_opd.tiny [--eval] [--rebuild] [--export-prebuilt]``.
"""

from nemo_opd.tiny.assets import TINY_NAMES, TINY_PREFIX, resolve_pretrained

__all__ = ["TINY_NAMES", "TINY_PREFIX", "resolve_pretrained"]
