"""HfWorker (the transformers generation backend) in this process: greedy decoding against the
model's own argmax, log-probs against an HF fp32 forward at the sampling distribution, per-row
seeds that do not depend on the batch, budgets, stop tokens, EOS and stop strings, top-k /
top-p, refit, score, and serving the trainer's own module."""

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer
from vllm_testing import (
    TEMPERATURE,
    full_state_dict,
    load_reference,
    random_prompts,
    reference_token_logprobs,
    tiny_qwen3,
)

from nemo_opd.generation.hf_worker import HfWorker
from nemo_opd.tiny.assets import resolve_pretrained

ATOL = 1e-5  # fp32 on both sides; the batched forward only reorders sums


def engine_cfg(**overrides) -> dict:
    return {"precision": "float32", "max_batch_tokens": 65536, **overrides}


def sampling(temperature: float = TEMPERATURE, **overrides) -> dict:
    """VllmGeneration._sampling's dict."""
    base = {"temperature": temperature, "top_p": 1.0, "top_k": None}
    return {**base, "stop_token_ids": None, "stop_strings": None, **overrides}


@pytest.fixture(scope="module")
def worker(model_dirs):
    return HfWorker(model_dirs["a"], None, engine_cfg())


@pytest.fixture(scope="module")
def reference_a(model_dirs):
    return load_reference(model_dirs["a"])


@pytest.fixture(scope="module")
def tiny():
    """(worker, tokenizer, prompts) on the tiny student, with its tokenizer (EOS stops)."""
    model, tokenizer_dir = resolve_pretrained("tiny:student"), resolve_pretrained("tiny:tokenizer")
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    questions = ["12 + 7 =", "3 * 4 =", "45 - 18 =", "9 + 96 ="]
    prompts = [
        tokenizer.apply_chat_template(
            [{"role": "user", "content": q}], add_generation_prompt=True, return_dict=True
        )["input_ids"]
        for q in questions
    ]
    return HfWorker(model, tokenizer_dir, engine_cfg()), tokenizer, prompts


def argmax_decoding(model, prompt: list[int], steps: int) -> list[int]:
    """Greedy decoding with a full forward per token (no cache, no padding)."""
    ids = list(prompt)
    with torch.no_grad():
        for _ in range(steps):
            ids.append(int(model(input_ids=torch.tensor([ids])).logits[0, -1].argmax()))
    return ids[len(prompt) :]


def test_greedy_equals_the_models_own_argmax_decoding(worker, reference_a):
    prompts = random_prompts(5, seed=3)
    out = worker.generate(prompts, [12] * 5, sampling(0.0))
    for prompt, ids, logprobs in zip(prompts, out.token_ids, out.logprobs, strict=True):
        assert ids == argmax_decoding(reference_a, prompt, 12)
        # greedy reports log-probs at temperature 1
        expected = reference_token_logprobs(reference_a, prompt, ids, 1.0)
        torch.testing.assert_close(torch.tensor(logprobs), expected, atol=ATOL, rtol=0)
    assert out.finish_reasons == ["length"] * 5


@pytest.mark.parametrize("top_k", [None, 5])
def test_logprobs_are_the_sampling_distributions(worker, reference_a, top_k):
    """Each sampled token's log-prob is log_softmax(logits / T) after top-k, renormalized."""
    prompts = random_prompts(4, seed=4)
    out = worker.generate(prompts, [10] * 4, sampling(top_k=top_k), seeds=[1, 2, 3, 4])
    for prompt, ids, logprobs in zip(prompts, out.token_ids, out.logprobs, strict=True):
        expected = reference_token_logprobs(reference_a, prompt, ids, TEMPERATURE, top_k)
        torch.testing.assert_close(torch.tensor(logprobs), expected, atol=ATOL, rtol=0)


def nucleus_logprobs(model, prompt, completion, temperature, top_p) -> torch.Tensor:
    """[len(completion), V] log-probs of the smallest set of most likely tokens whose
    probability reaches top_p (a token is kept when the tokens more likely than it hold less
    than top_p), renormalized; -inf elsewhere."""
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([prompt + completion])).logits[0]
    probs = torch.softmax(logits[len(prompt) - 1 : -1] / temperature, dim=-1)
    ordered, order = probs.sort(dim=-1, descending=True)
    before = ordered.cumsum(dim=-1) - ordered
    kept = torch.zeros_like(probs, dtype=torch.bool).scatter(-1, order, before < top_p)
    return torch.log(torch.where(kept, probs, 0.0) / (probs * kept).sum(-1, keepdim=True))


def test_top_p_samples_inside_the_nucleus_with_its_renormalized_logprobs(worker, reference_a):
    prompts = random_prompts(4, seed=5)
    out = worker.generate(prompts, [12] * 4, sampling(top_p=0.6), seeds=[5, 6, 7, 8])
    for prompt, ids, logprobs in zip(prompts, out.token_ids, out.logprobs, strict=True):
        nucleus = nucleus_logprobs(reference_a, prompt, ids, TEMPERATURE, 0.6)
        chosen = nucleus.gather(-1, torch.tensor(ids)[:, None]).squeeze(-1)
        assert torch.isfinite(chosen).all()  # every token came from the nucleus
        torch.testing.assert_close(torch.tensor(logprobs), chosen, atol=ATOL, rtol=0)


def test_top_k_samples_only_among_the_k_most_likely(worker, reference_a):
    prompts = random_prompts(3, seed=6)
    out = worker.generate(prompts, [16] * 3, sampling(2.0, top_k=2), seeds=[9, 10, 11])
    for prompt, ids in zip(prompts, out.token_ids, strict=True):
        with torch.no_grad():
            logits = reference_a(input_ids=torch.tensor([prompt + ids])).logits[0]
        top2 = logits[len(prompt) - 1 : -1].topk(2, dim=-1).indices
        assert (top2 == torch.tensor(ids)[:, None]).any(-1).all()


def test_a_prompt_samples_the_same_alone_and_in_any_batch(worker):
    """Row seeds: prompt i with seed s gives the same tokens alone, inside a batch of prompts
    of other lengths (left padding) and at another position; another seed gives others."""
    prompts = random_prompts(6, seed=7, min_len=2, max_len=20)
    seeds = [101, 7, 55, 3, 12, 9]
    batched = worker.generate(prompts, [16] * 6, sampling(), seeds)
    for prompt, seed, ids in zip(prompts, seeds, batched.token_ids, strict=True):
        assert worker.generate([prompt], [16], sampling(), [seed]).token_ids == [ids]
    reordered = worker.generate(prompts[::-1], [16] * 6, sampling(), seeds[::-1])
    assert reordered.token_ids == batched.token_ids[::-1]
    other = worker.generate(prompts, [16] * 6, sampling(), [s + 1000 for s in seeds])
    assert all(a != b for a, b in zip(other.token_ids, batched.token_ids, strict=True))


def test_batches_cut_by_max_batch_tokens_sample_as_one(model_dirs, worker):
    """A call cut into several batches (max_batch_tokens) gives what one batch gives."""
    prompts = random_prompts(7, seed=8)
    whole = worker.generate(prompts, [9] * 7, sampling(), list(range(7)))
    small = HfWorker(model_dirs["a"], None, engine_cfg(max_batch_tokens=40))
    cut = small.generate(prompts, [9] * 7, sampling(), list(range(7)))
    assert cut.token_ids == whole.token_ids
    torch.testing.assert_close(
        torch.tensor(cut.logprobs), torch.tensor(whole.logprobs), atol=ATOL, rtol=0
    )


def test_unseeded_calls_draw_from_the_engine_seed(model_dirs):
    prompts = random_prompts(3, seed=9)
    first = [HfWorker(model_dirs["a"], None, engine_cfg(), seed=4) for _ in range(2)]
    outs = [w.generate(prompts, [8] * 3, sampling()).token_ids for w in first]
    assert outs[0] == outs[1]
    assert first[0].generate(prompts, [8] * 3, sampling()).token_ids != outs[0]


def test_per_prompt_budgets(worker):
    prompts = random_prompts(4, seed=10)
    out = worker.generate(prompts, [1, 7, 16, 3], sampling(), [0, 1, 2, 3])
    # no tokenizer and no EOS in the model's config: every row runs to its budget
    assert [len(ids) for ids in out.token_ids] == [1, 7, 16, 3]
    assert [len(lp) for lp in out.logprobs] == [1, 7, 16, 3]
    assert out.finish_reasons == ["length"] * 4
    with pytest.raises(ValueError, match="one budget >= 1 per prompt"):
        worker.generate(prompts, [1, 0, 2, 2], sampling())


def test_stop_token_ids_end_a_row_with_the_token_kept(worker):
    prompts = random_prompts(4, seed=2)
    seeds = [5, 6, 7, 8]
    free = worker.generate(prompts, [16] * 4, sampling(), seeds)
    stop_id = free.token_ids[0][5]
    cut = free.token_ids[0].index(stop_id)
    stopped = worker.generate(prompts, [16] * 4, sampling(stop_token_ids=[stop_id]), seeds)
    assert stopped.token_ids[0] == free.token_ids[0][: cut + 1]
    assert stopped.finish_reasons[0] == "stop"
    assert stopped.logprobs[0] == pytest.approx(free.logprobs[0][: cut + 1], abs=ATOL)
    for ids, free_ids, reason in zip(
        stopped.token_ids, free.token_ids, stopped.finish_reasons, strict=True
    ):
        # rows stopping at other steps (and leaving the batch) do not change the others
        assert ids == free_ids[: len(ids)]
        assert (reason == "stop") == (stop_id in ids) and stop_id not in ids[:-1]


def test_a_stop_token_on_the_last_budgeted_token_is_a_stop(worker):
    prompt = random_prompts(1, seed=11)
    free = worker.generate(prompt, [6], sampling(), [3])
    last = free.token_ids[0][-1]
    if last in free.token_ids[0][:-1]:
        pytest.skip("the last token also occurs earlier")
    out = worker.generate(prompt, [6], sampling(stop_token_ids=[last]), [3])
    assert out.token_ids == free.token_ids and out.finish_reasons == ["stop"]


def test_eos_of_the_tokenizer_stops_generation(tiny):
    worker, tokenizer, prompts = tiny
    out = worker.generate(prompts, [48] * 4, sampling(1.0), [1, 2, 3, 4])
    for ids, reason in zip(out.token_ids, out.finish_reasons, strict=True):
        assert reason == "stop" and ids[-1] == tokenizer.eos_token_id
        assert tokenizer.eos_token_id not in ids[:-1]


def test_stop_strings_end_after_the_token_that_completes_them(tiny):
    worker, tokenizer, prompts = tiny
    free = worker.generate(prompts, [48] * 4, sampling(0.0))
    out = worker.generate(prompts, [48] * 4, sampling(0.0, stop_strings=["boxed"]))
    for ids, free_ids, reason in zip(
        out.token_ids, free.token_ids, out.finish_reasons, strict=True
    ):
        assert ids == free_ids[: len(ids)] and reason == "stop"
        assert "boxed" in tokenizer.decode(ids) and "boxed" not in tokenizer.decode(ids[:-1])
    without_tokenizer = HfWorker(resolve_pretrained("tiny:student"), None, engine_cfg())
    with pytest.raises(ValueError, match="stop_strings need a tokenizer"):
        without_tokenizer.generate(prompts, [4] * 4, sampling(stop_strings=["x"]))


def test_score_is_the_prompt_logprobs_of_an_hf_forward(worker, reference_a):
    pairs = zip(random_prompts(4, seed=12), random_prompts(4, seed=13), strict=True)
    sequences = [p + c for p, c in pairs]
    for got, sequence in zip(worker.score(sequences), sequences, strict=True):
        want = reference_token_logprobs(reference_a, sequence[:1], sequence[1:])
        assert len(got) == len(sequence) - 1
        torch.testing.assert_close(torch.tensor(got), want, atol=ATOL, rtol=0)


def perturbed(model_dir: str, path) -> tuple[torch.nn.Module, str]:
    """Model `model_dir` with noise on every tensor (the tied embedding and lm_head get the
    same perturbed tensor), and the directory it is saved to."""
    torch.manual_seed(0)
    model = load_reference(model_dir)
    with torch.no_grad():
        for param in model.parameters():
            param.add_(0.2 * param.std() * torch.randn_like(param))
    model.save_pretrained(path)
    return model, str(path)


def test_update_weights_serves_the_new_weights(model_dirs, tmp_path):
    """After update_weights, the engine samples what a fresh engine on the new weights does."""
    worker = HfWorker(model_dirs["a"], None, engine_cfg())
    new_model, new_dir = perturbed(model_dirs["a"], tmp_path / "new")
    prompts, seeds = random_prompts(4, seed=14), [1, 2, 3, 4]
    before = worker.generate(prompts, [12] * 4, sampling(), seeds)
    assert worker.update_weights(full_state_dict(new_model)) >= 0
    after = worker.generate(prompts, [12] * 4, sampling(), seeds)
    fresh = HfWorker(new_dir, None, engine_cfg()).generate(prompts, [12] * 4, sampling(), seeds)
    assert after.token_ids == fresh.token_ids != before.token_ids
    torch.testing.assert_close(
        torch.tensor(after.logprobs), torch.tensor(fresh.logprobs), atol=ATOL, rtol=0
    )


def test_update_weights_refuses_an_incomplete_or_foreign_state_dict(worker, reference_a):
    weights = full_state_dict(reference_a)
    weights.pop("model.norm.weight")
    weights["model.extra.weight"] = torch.zeros(1)
    with pytest.raises(ValueError, match=r"1 of the model's tensors missing \(model.norm.weight"):
        worker.update_weights(weights)


def test_bfloat16_engine_stays_near_the_fp32_logprobs(model_dirs, reference_a):
    worker = HfWorker(model_dirs["a"], None, engine_cfg(precision="bfloat16"))
    assert next(worker.model.parameters()).dtype == torch.bfloat16
    prompts = random_prompts(3, seed=15)
    out = worker.generate(prompts, [8] * 3, sampling(), [1, 2, 3])
    for prompt, ids, logprobs in zip(prompts, out.token_ids, out.logprobs, strict=True):
        expected = reference_token_logprobs(reference_a, prompt, ids, TEMPERATURE)
        torch.testing.assert_close(torch.tensor(logprobs), expected, atol=0.1, rtol=0)


def test_a_shared_module_is_served_as_it_is_and_refit_copies_nothing(model_dirs, tmp_path):
    """share_module: generate reads the module (here with the training engines' segment
    attention, which ignores padding masks: the engine generates with sdpa and puts the
    module's attention and training mode back); a change to its weights shows at once."""
    from nemo_opd.distributed.context_parallel import register_attention

    module = AutoModelForCausalLM.from_pretrained(
        model_dirs["a"], dtype=torch.float32, attn_implementation=register_attention()
    ).train()
    attention = module.config._attn_implementation
    worker = HfWorker(model_dirs["a"], None, engine_cfg(), module=module)
    own = HfWorker(model_dirs["a"], None, engine_cfg())
    prompts, seeds = random_prompts(5, seed=16, min_len=2, max_len=20), list(range(5))
    assert (
        worker.generate(prompts, [10] * 5, sampling(), seeds).token_ids
        == own.generate(prompts, [10] * 5, sampling(), seeds).token_ids
    )
    assert module.training and module.config._attn_implementation == attention

    new_model, _ = perturbed(model_dirs["a"], tmp_path / "new")
    module.load_state_dict(new_model.state_dict())  # the trainer's step
    own.update_weights(full_state_dict(new_model))
    assert (
        worker.generate(prompts, [10] * 5, sampling(), seeds).token_ids
        == own.generate(prompts, [10] * 5, sampling(), seeds).token_ids
    )
    with pytest.raises(RuntimeError, match="refit must not copy"):
        worker.update_weights(full_state_dict(new_model))


def test_padded_vocabulary_rows_are_never_sampled(model_dirs):
    """A trainer's module whose output layer has rows past config.vocab_size (vocabulary
    padding) generates what the unpadded model does."""
    from nemo_opd.policy.engines.dtensor_parallelize import apply_vocab_padding

    module = load_reference(model_dirs["a"])
    vocab = module.config.vocab_size
    apply_vocab_padding(module, vocab + 64)
    with torch.no_grad():
        module.get_output_embeddings().weight[vocab:] = 50.0  # would win every draw
    worker = HfWorker(model_dirs["a"], None, engine_cfg(), module=module)
    own = HfWorker(model_dirs["a"], None, engine_cfg())
    prompts = random_prompts(3, seed=17)
    out = worker.generate(prompts, [8] * 3, sampling(), [1, 2, 3])
    assert out.token_ids == own.generate(prompts, [8] * 3, sampling(), [1, 2, 3]).token_ids
    assert len(worker.score([prompts[0]])[0]) == len(prompts[0]) - 1


def test_sleep_and_wake_up_are_no_ops_on_cpu(worker):
    worker.sleep()
    worker.wake_up()
    assert not worker.asleep and worker.ready() > 0


def test_a_random_qwen3_with_eos_in_its_config_stops_on_it(tmp_path):
    """EOS from the model's generation config stops a row even without a tokenizer (as vLLM
    reads generation_config.json)."""
    torch.manual_seed(3)
    config = tiny_qwen3()
    config.eos_token_id = 7
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    with torch.no_grad():
        model.model.embed_tokens.weight.mul_(4.0)
        model.lm_head.weight[7] += 0.5  # so that 7 comes up soon
    model.save_pretrained(tmp_path)
    worker = HfWorker(str(tmp_path), None, engine_cfg())
    out = worker.generate(random_prompts(6, seed=18), [40] * 6, sampling(1.0), list(range(6)))
    stops = [ids for ids, r in zip(out.token_ids, out.finish_reasons, strict=True) if r == "stop"]
    assert stops and all(ids[-1] == 7 and 7 not in ids[:-1] for ids in stops)
