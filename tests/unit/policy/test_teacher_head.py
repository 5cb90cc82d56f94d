"""load_teacher_head reads the teacher's LM head wherever the engines load the teacher from: a
local folder (one safetensors file or shards behind an index), or a hub name ("org/name")
resolved through the Hugging Face cache, here offline from a cache folder made in the test; and
it keeps the family's bias and step (tests/model_families.py)."""

import subprocess
import sys
from pathlib import Path

import torch
from model_families import VOCAB, build_family_model

from nemo_opd.policy.engines.teacher_head import load_teacher_head

PADDED = 384
"""VOCAB padded as the engines pad it (vocab_padding.padded_vocab_size, tp 2)."""
COMMIT = "0123456789abcdef0123456789abcdef01234567"


def expected_shard(model: torch.nn.Module, tp: int, rank: int) -> tuple:
    """(rows, bias) of `rank`'s shard of the padded head, from the model itself."""
    head = model.get_output_embeddings()
    rows = torch.zeros(PADDED, head.weight.shape[1])
    rows[:VOCAB] = head.weight.detach()
    bias = torch.zeros(PADDED)
    if head.bias is not None:
        bias[:VOCAB] = head.bias.detach()
    return rows.chunk(tp)[rank], bias.chunk(tp)[rank]


def test_a_sharded_checkpoint_gives_its_head_and_bias(tmp_path):
    model = build_family_model("phi", seed=3)
    model.save_pretrained(tmp_path, max_shard_size="40KB")
    assert (tmp_path / "model.safetensors.index.json").is_file()
    head = load_teacher_head(tmp_path, VOCAB, PADDED, 2, 1, torch.device("cpu"), torch.float32)
    rows, bias = expected_shard(model, 2, 1)
    assert head.head.family == "phi" and head.head.biased
    torch.testing.assert_close(head.weight, rows, rtol=0, atol=0)
    torch.testing.assert_close(head.bias, bias, rtol=0, atol=0)


def hub_cache(root: Path, repo: str, model: torch.nn.Module) -> Path:
    """A Hugging Face hub cache folder holding `model` as the hub's `repo` at COMMIT (the
    layout huggingface_hub writes: models--org--name/{refs/main, snapshots/<commit>/})."""
    folder = root / f"models--{repo.replace('/', '--')}"
    snapshot = folder / "snapshots" / COMMIT
    model.save_pretrained(snapshot)
    (folder / "refs").mkdir(parents=True)
    (folder / "refs" / "main").write_text(COMMIT)
    return root


SCRIPT = """
import sys, torch
from nemo_opd.policy.engines.teacher_head import load_teacher_head
head = load_teacher_head(sys.argv[1], {vocab}, {padded}, 2, 0, torch.device("cpu"), torch.float32)
torch.save({{"weight": head.weight, "bias": head.bias, "family": head.head.family,
            "divide_by": head.head.divide_by}}, sys.argv[2])
"""


def test_a_hub_name_is_read_from_the_cache_offline(tmp_path):
    """teacher.model_name "org/name", as a recipe names Qwen/Qwen3-4B: read through the cache
    with HF_HUB_OFFLINE=1 (no network), in a fresh process whose Hugging Face settings are the
    test's own."""
    model = build_family_model("granite", seed=4)
    cache = hub_cache(tmp_path / "hub", "org/tiny-granite", model)
    env = {
        "HF_HOME": str(tmp_path / "home"),
        "HF_HUB_CACHE": str(cache),
        "HF_HUB_OFFLINE": "1",
        "PATH": "/usr/bin:/bin",
    }
    out = tmp_path / "head.pt"
    script = SCRIPT.format(vocab=VOCAB, padded=PADDED)
    done = subprocess.run(
        [sys.executable, "-c", script, "org/tiny-granite", str(out)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    got = torch.load(out)
    rows, _ = expected_shard(model, 2, 0)
    assert got["family"] == "granite" and got["divide_by"] == 8.0 and got["bias"] is None
    torch.testing.assert_close(got["weight"], rows, rtol=0, atol=0)
