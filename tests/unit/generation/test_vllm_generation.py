"""VllmGeneration on CPU: seeded sampling, budgets, stop tokens, log-probs against an HF fp32
forward, refit (in-place weight update, version skipping, tied embeddings), and the refit probe
end to end from a Policy. One module so that the engines start once (importing vLLM takes
seconds of CPU per engine process). The module's two engines are processes of this machine (the
processes executor); an engine in this process (the local executor) must sample as they do, and
an engine Ray cannot schedule must time out with the reason. The loop's runs on Ray compare
with the other executors in tests/functional/test_executors_tiny.py."""

import importlib.util

import pytest
import torch
from vllm_testing import (
    MAX_LEN,
    TEMPERATURE,
    full_state_dict,
    generation_config,
    load_reference,
    random_prompts,
    reference_token_logprobs,
)

from nemo_opd.config import ClusterConfig, PolicyConfig
from nemo_opd.generation import logprob_mismatch
from nemo_opd.utils.seeds import request_seed

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("vllm") is None, reason="needs vllm (the cpu or gpu extra)"
)

ATOL = 1e-3


class Engines:
    """The module's two engines on model "a" (so prompts are split and gathered), started on
    first use. The test that kills one ends them (spend); a test after it gets new ones."""

    def __init__(self, model_dir: str) -> None:
        self.model_dir, self.generation = model_dir, None

    def get(self):
        from nemo_opd.generation import VllmGeneration

        if self.generation is None:
            self.generation = VllmGeneration(
                generation_config(),
                self.model_dir,
                None,
                device_type="cpu",
                num_engines=2,
                executor="processes",
            )
        return self.generation

    def spend(self) -> None:
        generation, self.generation = self.generation, None
        if generation is not None:
            generation.shutdown()


@pytest.fixture(scope="module")
def engines(model_dirs):
    held = Engines(model_dirs["a"])
    yield held
    held.spend()


@pytest.fixture
def generation(engines):
    """The module's two engines (Engines)."""
    return engines.get()


@pytest.fixture(scope="module")
def reference_a(model_dirs):
    return load_reference(model_dirs["a"])


def test_seeded_sampling_is_reproducible(generation):
    prompts = random_prompts(6)
    first = generation.generate(prompts, seed=7)
    again = generation.generate(prompts, seed=7)
    other = generation.generate(prompts, seed=8)
    assert first.token_ids == again.token_ids
    assert first.logprobs == again.logprobs
    assert first.token_ids != other.token_ids
    greedy = [generation.generate(prompts, greedy=True).token_ids for _ in range(2)]
    assert greedy[0] == greedy[1]


def test_seeds_do_not_depend_on_the_split(generation):
    """Prompt i samples with request_seed(seed, i, 0) wherever it runs: a sub-batch seeded
    with its first row's seed reproduces its rows."""
    prompts = random_prompts(6)
    full = generation.generate(prompts, seed=3)
    tail = generation.generate(prompts[4:], seed=request_seed(3, 4, 0))
    assert tail.token_ids == full.token_ids[4:]


def test_one_seed_per_prompt(generation):
    """Given one seed per prompt, each prompt samples as it does alone with that seed; a
    later turn's seed (nemo_opd.utils.seeds.request_seed) samples apart."""
    prompts = random_prompts(4, seed=4)
    seeds = [101, 7, request_seed(7, 0, 3), request_seed(101, 0, 1)]
    out = generation.generate(prompts, seed=seeds)
    for prompt, seed, ids in zip(prompts, seeds, out.token_ids, strict=True):
        assert generation.generate([prompt], seed=seed).token_ids == [ids]
    same_prompt = generation.generate([prompts[0]] * 2, seed=seeds[::3])
    assert same_prompt.token_ids[0] == out.token_ids[0] != same_prompt.token_ids[1]
    with pytest.raises(ValueError, match=r"one seed per prompt \(4\), got 2"):
        generation.generate(prompts, seed=seeds[:2])


def test_seeded_sampling_of_more_prompt_tokens_than_one_scheduler_step(generation):
    """Hundreds of seeded prompts in one call (more prompt tokens than vLLM's per-step budget on
    CPU, which with chunked prefill made vLLM rewind CPU generators and fail) sample the same
    tokens as when sent a few at a time."""
    from nemo_opd.generation.vllm_worker import CPU_STEP_TOKENS

    prompts = random_prompts(640, seed=5, min_len=20, max_len=40)
    assert sum(map(len, prompts)) > 2 * CPU_STEP_TOKENS  # each engine gets half
    full = generation.generate(prompts, seed=11, max_new_tokens=2)
    assert all(1 <= len(t) <= 2 for t in full.token_ids)
    tail = generation.generate(
        prompts[-3:], seed=request_seed(11, len(prompts) - 3, 0), max_new_tokens=2
    )
    assert tail.token_ids == full.token_ids[-3:]


def test_per_prompt_budgets_and_finish_reasons(generation):
    prompts = random_prompts(5, seed=1)
    budgets = [1, 7, 0, 16, 3]
    out = generation.generate(prompts, max_new_tokens=budgets, seed=0)
    # no tokenizer, hence no EOS and no stop tokens: every row runs to its budget
    assert [len(ids) for ids in out.token_ids] == budgets
    assert [len(lp) for lp in out.logprobs] == budgets
    assert out.finish_reasons == ["length"] * 5
    default = generation.generate(prompts[:2], seed=0)
    assert [len(ids) for ids in default.token_ids] == [16, 16]  # cfg.max_new_tokens
    with pytest.raises(ValueError, match="budgets"):
        generation.generate(prompts, max_new_tokens=[1, 2])


def test_stop_token_ids_end_generation(generation):
    prompts = random_prompts(4, seed=2)
    free = generation.generate(prompts, seed=5)
    stop_id = free.token_ids[0][5]
    cut = free.token_ids[0].index(stop_id)  # its first occurrence
    cfg = generation.cfg
    generation.cfg = cfg.model_copy(update={"stop_token_ids": [stop_id]})
    try:
        stopped = generation.generate(prompts, seed=5)
    finally:
        generation.cfg = cfg
    # same seeds: identical up to the stop token, which is included and ends the row
    assert stopped.token_ids[0] == free.token_ids[0][: cut + 1]
    assert stopped.finish_reasons[0] == "stop"
    assert stopped.logprobs[0] == pytest.approx(free.logprobs[0][: cut + 1], abs=1e-6)
    for ids, reason in zip(stopped.token_ids, stopped.finish_reasons, strict=True):
        assert (reason == "stop") == (stop_id in ids)
        assert stop_id not in ids[:-1]


@pytest.mark.parametrize("mode", ["temperature", "greedy", "top_k"])
def test_logprobs_match_hf_forward(generation, reference_a, mode):
    """Sampled-token log-probs = HF fp32 log_softmax of the sampling distribution."""
    prompts = random_prompts(4, seed=3)
    cfg = generation.cfg
    if mode == "top_k":
        generation.cfg = cfg.model_copy(update={"top_k": 5})
    try:
        out = generation.generate(prompts, seed=11, greedy=mode == "greedy")
    finally:
        generation.cfg = cfg
    temperature = 1.0 if mode == "greedy" else TEMPERATURE  # greedy applies no temperature
    top_k = 5 if mode == "top_k" else None
    for prompt, ids, logprobs in zip(prompts, out.token_ids, out.logprobs, strict=True):
        expected = reference_token_logprobs(reference_a, prompt, ids, temperature, top_k)
        torch.testing.assert_close(torch.tensor(logprobs), expected, atol=ATOL, rtol=0)
        if mode == "greedy":
            with torch.no_grad():
                logits = reference_a(input_ids=torch.tensor([prompt + ids])).logits[0]
            assert ids == logits[len(prompt) - 1 : -1].argmax(-1).tolist()


def test_refit_loads_new_weights_and_skips_known_versions(generation, reference_a, model_dirs):
    pairs = zip(random_prompts(4, seed=4), random_prompts(4, seed=5), strict=True)
    sequences = [p + c for p, c in pairs]

    def hf_scores(model):
        return [reference_token_logprobs(model, s[:1], s[1:]) for s in sequences]

    def vllm_scores():
        return [torch.tensor(row) for row in generation.score(sequences)]

    old = hf_scores(reference_a)
    for got, want in zip(vllm_scores(), old, strict=True):
        torch.testing.assert_close(got, want, atol=ATOL, rtol=0)

    # new weights: model "a" with noise on every tensor; the tied embedding and lm_head get the
    # same perturbed tensor, so a stale lm_head would show as a mismatch
    torch.manual_seed(0)
    new_model = load_reference(model_dirs["a"])
    with torch.no_grad():
        for param in new_model.parameters():
            param.add_(0.2 * param.std() * torch.randn_like(param))
    new = hf_scores(new_model)
    assert generation.refit(full_state_dict(new_model), version=1) is True
    gaps = []
    for got, want, before in zip(vllm_scores(), new, old, strict=True):
        torch.testing.assert_close(got, want, atol=ATOL, rtol=0)
        gaps.append((want - before).abs().mean())
    assert min(gaps) > 0.05  # the refit made a visible difference

    # generation uses the new weights too
    prompts = random_prompts(2, seed=6)
    out = generation.generate(prompts, seed=1)
    for prompt, ids, logprobs in zip(prompts, out.token_ids, out.logprobs, strict=True):
        expected = reference_token_logprobs(new_model, prompt, ids, TEMPERATURE)
        torch.testing.assert_close(torch.tensor(logprobs), expected, atol=ATOL, rtol=0)

    # the same version again is skipped: the engine keeps the version-1 weights
    assert generation.refit(full_state_dict(reference_a), version=1) is False
    for got, want in zip(vllm_scores(), new, strict=True):
        torch.testing.assert_close(got, want, atol=ATOL, rtol=0)

    # restore model "a" for any later test
    assert generation.refit(full_state_dict(reference_a), version=2) is True


def student_config(model_dir: str) -> PolicyConfig:
    return PolicyConfig.model_validate(
        {
            "model_name": model_dir,
            "tokenizer": {"name": model_dir},
            "precision": "float32",
            "train_global_batch_size": 4,
            "logprob_batch_size": 4,
            "max_total_sequence_length": MAX_LEN,
            "optimizer": {"lr": 1e-3},
        }
    )


def as_batch(prompts: list, completions: list) -> tuple[dict, torch.Tensor]:
    """Right-padded rows of prompt + completion ({input_ids [B, S], input_lengths [B]}) and the
    [B, S] mask of the positions where Policy.get_logprobs scores a completion token (position
    t scores token t + 1)."""
    rows = [p + c for p, c in zip(prompts, completions, strict=True)]
    width = max(len(r) for r in rows)
    ids = torch.zeros(len(rows), width, dtype=torch.long)
    mask = torch.zeros(len(rows), width)
    for b, (prompt, row) in enumerate(zip(prompts, rows, strict=True)):
        ids[b, : len(row)] = torch.tensor(row)
        mask[b, len(prompt) - 1 : len(row) - 1] = 1.0
    lengths = torch.tensor([len(r) for r in rows])
    return {"input_ids": ids, "input_lengths": lengths}, mask


def test_policy_weights_refit_into_vllm(generation, reference_a, model_dirs):
    """Policy.full_weights_ref() -> refit -> the engine's sampled-token log-probs equal
    Policy.get_logprobs at the sampling temperature (the probe the loop runs). The restore at
    the end refits from a plain dict, the other accepted form."""
    from nemo_opd.policy.policy import Policy

    # Two 1-CPU training workers, processes of this machine beside the engines'
    cluster = ClusterConfig(num_nodes=1, gpus_per_node=2, device="cpu", cpus_per_worker=1)
    # the student is model "b"; the engines hold model "a" and must become "b"
    policy = Policy(student_config(model_dirs["b"]), cluster, executor="processes")
    prompts = random_prompts(4, seed=9)

    def mismatch() -> float:
        out = generation.generate(prompts, seed=2)
        batch, mask = as_batch(prompts, out.token_ids)
        student = policy.get_logprobs(batch, temperature=TEMPERATURE)
        engine = torch.zeros_like(student)
        engine[mask.bool()] = torch.tensor([x for row in out.logprobs for x in row])
        return logprob_mismatch(engine, student, mask)

    try:
        stale = mismatch()
        assert generation.refit(policy.full_weights_ref(), version=100 + policy.step) is True
        fresh = mismatch()
        assert fresh < 1e-3 < 0.05 < stale
    finally:
        policy.shutdown()
        generation.refit(full_state_dict(reference_a), version=-1)


def test_an_engine_that_cannot_start_says_why_and_what_to_set(model_dirs):
    """On CPU, 0.001 of the host's memory is less than the engine's process already holds (this
    one: the engine starts in it, the local executor, which reports a failed start in the Ray
    engines' words). The failed start leaves torch.set_num_threads as it was (vLLM replaces it
    while it builds), so the models started after it still set their thread count."""
    from nemo_opd.errors import RunError
    from nemo_opd.generation import VllmGeneration

    cfg = generation_config()
    vllm_cfg = cfg.vllm_cfg.model_copy(
        update={"kv_cache_memory_bytes": None, "gpu_memory_utilization": 0.001}
    )
    cfg = cfg.model_copy(update={"vllm_cfg": vllm_cfg})
    set_num_threads, threads = torch.set_num_threads, torch.get_num_threads()
    try:
        with pytest.raises(RunError) as caught:
            VllmGeneration(cfg, model_dirs["a"], None, device_type="cpu", executor="local")
        assert torch.set_num_threads is set_num_threads, torch.set_num_threads
    finally:
        torch.set_num_threads = set_num_threads
        torch.set_num_threads(threads)
    message = str(caught.value)
    assert message.startswith("vLLM could not start: its constructor raised ValueError: ")
    assert (
        "memory" in message and "kv_cache_memory_bytes gives the KV cache a fixed size" in message
    )


def test_an_engine_that_is_never_scheduled_times_out_with_the_reason(
    ray_session, model_dirs, monkeypatch
):
    """An engine that asks for more CPUs than the cluster has waits for them forever; the wait
    ends at its time-out with a message saying what to look at."""
    from nemo_opd.errors import RunError
    from nemo_opd.generation import VllmGeneration
    from nemo_opd.generation import vllm_generation as module

    monkeypatch.setattr(module, "READY_TIMEOUT_S", 2.0)
    with pytest.raises(RunError, match=r"did not start within 2 s: .* never scheduled"):
        VllmGeneration(
            generation_config(), model_dirs["a"], None, device_type="cpu", cpus_per_engine=64
        )


def test_an_engine_in_this_process_serves_as_the_other_processes_engines_do(generation, model_dirs):
    """The engine as an object of the test process (the local executor) samples the module's
    engines' tokens with their log-probs at the same seeds and thread count, refits from a dict
    in place, and names a call it rejects in the same words. It shuts down when its
    VllmGeneration does: no collection later tears it down (vLLM's teardown ends the process's
    torch.distributed group) under the engines that use the group then."""
    import gc

    import torch.distributed as dist

    from nemo_opd.distributed.process_group import init_local_process_group

    serve_in_this_process(generation, model_dirs)  # its frame, the engine's last holder, ends
    init_local_process_group("cpu")  # the process's group, as the next engine here finds it
    gc.unfreeze()  # what vLLM's start froze is collectable again, as after any vLLM teardown
    gc.collect()
    assert dist.is_initialized(), "the engine's teardown came after its shutdown"
    total = torch.ones(1)
    dist.all_reduce(total)
    assert total.item() == 1.0


def serve_in_this_process(generation, model_dirs) -> None:
    from nemo_opd.errors import RunError
    from nemo_opd.generation import VllmGeneration

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the module's engines' OMP_NUM_THREADS
    local = VllmGeneration(
        generation_config(), model_dirs["a"], None, device_type="cpu", executor="local"
    )
    try:
        prompts = random_prompts(6, seed=12)
        ours, theirs = local.generate(prompts, seed=7), generation.generate(prompts, seed=7)
        assert ours.token_ids == theirs.token_ids
        assert ours.logprobs == theirs.logprobs
        assert local.score(prompts) == generation.score(prompts)
        assert local.nodes() == [("local", "this process")]
        [marks] = local.startup_marks()
        assert "engine_ready" in marks
        weights_b = full_state_dict(load_reference(model_dirs["b"]))
        assert local.refit(weights_b, version=1) is True
        assert local.refit(weights_b, version=1) is False  # the version it holds
        assert local.score(prompts) != generation.score(prompts)
        with pytest.raises(RunError) as raised:
            local.generate(random_prompts(1, min_len=MAX_LEN + 1, max_len=MAX_LEN + 1))
        engine = f"vLLM engine 0 (of 1, serving {model_dirs['a']})"
        message = str(raised.value)
        assert message.startswith(f"{engine} raised ") and " while generating; " in message
        assert "\n" not in message
        assert local.generate(prompts, seed=7).token_ids  # it serves the next call
    finally:
        local.shutdown()
        torch.set_num_threads(threads)
    local.shutdown()  # idempotent: nothing is left to stop


def test_an_engine_that_raises_or_dies_ends_the_call_with_one_line_naming_it(engines, model_dirs):
    """Real faults of a running engine: a call it rejects (a prompt past max_model_len), then
    its process killed with SIGKILL (as the OOM killer does). Each ends the call with a
    one-line RunError naming the engine and what happened, never a traceback. The module's
    engines are spent by it (the last test here that uses them)."""
    import contextlib
    import os
    import re
    import signal

    import psutil

    from nemo_opd.errors import RunError

    generation = engines.get()
    engine = f"vLLM engine 0 (of 2, serving {model_dirs['a']})"
    try:
        with pytest.raises(RunError) as raised:  # one prompt: engine 0's
            generation.generate(random_prompts(1, min_len=MAX_LEN + 1, max_len=MAX_LEN + 1))
        message = str(raised.value)
        assert message.startswith(f"{engine} raised ") and " while generating; " in message
        assert "\n" not in message

        pid = generation.engines.pids()[0]
        os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(psutil.NoSuchProcess):
            psutil.Process(pid).wait(timeout=30)
        with pytest.raises(RunError) as raised:  # a prompt each: engine 1 answers its own
            generation.generate(random_prompts(2), seed=1)
        message = str(raised.value)
        died = rf"{re.escape(engine)} died \(pid {pid}: [^\n]*\) while generating; "
        assert re.match(died, message), message
        assert message.endswith("run the same command to resume from the newest")
        assert "\n" not in message
    finally:
        engines.spend()
