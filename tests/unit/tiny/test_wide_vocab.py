"""The tiny models widened to a larger vocabulary (nemo_opd.tiny.wide_vocab): the real ids'
distribution unchanged, the extra ids out of reach (checked on held-out text and samples), and
extra rows too weak to hide refused."""

import math

import pytest
import torch
from transformers import AutoTokenizer, Qwen3ForCausalLM

from nemo_opd.tiny import wide_vocab
from nemo_opd.tiny.assets import ensure_tiny_assets
from nemo_opd.tiny.recipe import default_recipe, micro_recipe

VOCAB = 4096


@pytest.fixture(scope="module")
def tiny():
    """The default tiny pair (installed from the shipped copy): (assets, tokenizer, train
    records, validation records), a few hundred of each."""
    assets = ensure_tiny_assets(default_recipe())
    tokenizer = AutoTokenizer.from_pretrained(assets.tokenizer)
    train = wide_vocab.read_jsonl(assets.train_file)[:300]
    check = wide_vocab.read_jsonl(assets.validation_file)[:100]
    return assets, tokenizer, train, check


def test_max_margin_direction_matches_a_brute_force_search():
    gen = torch.Generator().manual_seed(0)
    angles = torch.rand(300, generator=gen, dtype=torch.float64) * 2.0 + 0.3  # a 2-rad cone
    radii = torch.rand(300, generator=gen, dtype=torch.float64) + 0.5
    points = torch.stack([radii * angles.cos(), radii * angles.sin()], 1).float()
    u, margin = wide_vocab.max_margin_direction(points)
    grid = torch.linspace(0, 2 * math.pi, 200_001, dtype=torch.float64)
    directions = torch.stack([grid.cos(), grid.sin()], 1)
    best = float((points.double() @ directions.T).min(0).values.max())
    assert u.norm().item() == pytest.approx(1.0, abs=1e-6)
    assert margin == pytest.approx(best, abs=2e-4)
    assert float((points @ u).min()) == pytest.approx(margin, abs=1e-5)


def test_points_around_the_origin_have_no_positive_margin():
    gen = torch.Generator().manual_seed(1)
    _, margin = wide_vocab.max_margin_direction(torch.randn(500, 8, generator=gen))
    assert margin <= 0


def test_widened_model_keeps_the_real_distribution_and_hides_the_extra_ids(tiny, tmp_path):
    assets, tokenizer, train, check = tiny
    report = wide_vocab.widen(assets.teacher, tmp_path / "wide", tokenizer, train, check, VOCAB)
    n_real = len(tokenizer)
    assert report["real_ids"] == n_real and report["vocab_size"] == VOCAB
    assert report["fit_min_margin"] > 0 and report["alpha"] >= 1.0
    for name in ("heldout", "samples"):
        assert report[f"{name}_positions"] > 1000
        assert report[f"{name}_max_extra_mass"] <= wide_vocab.MAX_EXTRA_MASS

    original = Qwen3ForCausalLM.from_pretrained(assets.teacher, dtype=torch.float32).eval()
    wide = Qwen3ForCausalLM.from_pretrained(tmp_path / "wide", dtype=torch.float32).eval()
    assert wide.config.vocab_size == VOCAB and wide.get_input_embeddings().weight.shape[0] == VOCAB
    extra = wide.get_input_embeddings().weight[n_real:]
    assert torch.equal(extra, extra[:1].expand_as(extra))  # one row, -alpha * u
    assert extra[0].norm().item() == pytest.approx(report["alpha"], rel=1e-5)
    real_rows = wide.get_input_embeddings().weight[:n_real]
    assert torch.equal(real_rows, original.model.embed_tokens.weight)

    text = check[0]["prompt"] + " " + check[0]["solution"]
    ids = tokenizer(text, return_tensors="pt")["input_ids"]
    with torch.no_grad():
        before = torch.log_softmax(original(ids).logits.double(), -1)
        after = torch.log_softmax(wide(ids).logits.double(), -1)
    assert after.shape[-1] == VOCAB
    torch.testing.assert_close(after[..., :n_real], before, rtol=0, atol=1e-5)
    assert after[..., n_real:].exp().sum(-1).max().item() <= wide_vocab.MAX_EXTRA_MASS
    assert AutoTokenizer.from_pretrained(tmp_path / "wide").get_vocab() == tokenizer.get_vocab()


def test_extra_rows_too_weak_to_hide_are_refused(tiny, tmp_path, monkeypatch):
    assets, tokenizer, train, check = tiny
    monkeypatch.setattr(wide_vocab, "MARGIN_NATS", -60.0)  # alpha at its floor of 1
    refused = "extra ids reach probability|sampled an id beyond"
    with pytest.raises(wide_vocab.WideVocabError, match=refused):
        wide_vocab.widen(assets.student, tmp_path / "weak", tokenizer, train, check[:8], VOCAB)
    assert not (tmp_path / "weak").exists()


def test_a_model_whose_states_surround_the_origin_is_refused(tmp_path, monkeypatch):
    """The micro recipe's models barely trained: their samples are noise, and no direction
    separates those hidden states from the origin."""
    monkeypatch.setenv("NEMO_OPD_CACHE", str(tmp_path / "cache"))
    assets = ensure_tiny_assets(micro_recipe())
    tokenizer = AutoTokenizer.from_pretrained(assets.tokenizer)
    train = wide_vocab.read_jsonl(assets.train_file)[:100]
    with pytest.raises(wide_vocab.WideVocabError, match="no direction separates"):
        wide_vocab.widen(assets.teacher, tmp_path / "wide", tokenizer, train, train, VOCAB)
    assert not (tmp_path / "wide").exists()
