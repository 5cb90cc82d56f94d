"""Shared-prefix scoring (dtensor_cfg.shared_prefix_scoring): the plan lays every row's tokens
once, a shared prefix once per scoring row, and maps each row's positions back; the DTensor
engine then scores exactly as it does each row whole (the top-k, the log-probs and the hidden
states, padded and packed microbatches), while running fewer tokens forward. In this process
(world size 1, gloo), no Ray."""

import pytest
import torch
from tiny_policies import SEQ, VOCAB, policy_config

from nemo_opd.data.batching import TensorBatch
from nemo_opd.policy.engines.dtensor import DTensorEngine
from nemo_opd.policy.engines.shared_prefix import MIN_SHARED, find_groups, plan_scoring_rows

PROMPTS = (17, 18, 20)  # prompt lengths (> MIN_SHARED); each prompt has SAMPLES rows
SAMPLES = 4


def grouped_batch(seed: int = 0) -> TensorBatch:
    """Rows in the loop's order: SAMPLES samples of each prompt (shared prompt tokens, then
    responses of 1 to 6 tokens), then a row of its own and a row shorter than MIN_SHARED;
    the last response token of each sampled row is trained."""
    gen = torch.Generator().manual_seed(seed)
    rows, lengths, starts = [], [], []
    for prompt_length in PROMPTS:
        prompt = torch.randint(1, VOCAB, (prompt_length,), generator=gen)
        for _ in range(SAMPLES):
            length = min(SEQ, prompt_length + int(torch.randint(1, 7, (1,), generator=gen)))
            response = torch.randint(1, VOCAB, (length - prompt_length,), generator=gen)
            rows.append(torch.cat([prompt, response]))
            lengths.append(length)
            starts.append(prompt_length)
    for length in (SEQ - 1, MIN_SHARED - 4):
        rows.append(torch.randint(1, VOCAB, (length,), generator=gen))
        lengths.append(length)
        starts.append(3)
    ids = torch.zeros(len(rows), SEQ, dtype=torch.long)
    token_mask = torch.zeros(len(rows), SEQ)
    for index, (row, start) in enumerate(zip(rows, starts, strict=True)):
        ids[index, : len(row)] = row
        token_mask[index, start : len(row)] = 1.0
    return TensorBatch(
        input_ids=ids,
        input_lengths=torch.tensor(lengths),
        token_mask=token_mask,
        sample_mask=torch.ones(len(rows)),
    )


def test_groups_share_the_longest_common_start_less_one_token():
    batch = grouped_batch()
    lengths = batch["input_lengths"].tolist()
    groups = find_groups(batch["input_ids"], lengths)
    shared = [group for group in groups if group.shared]
    assert [group.rows for group in shared] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]]
    for group, prompt in zip(shared, PROMPTS, strict=True):
        shortest = min(lengths[r] for r in group.rows)
        assert prompt <= group.shared <= shortest - 1  # responses may agree on a first token
    alone = [group for group in groups if not group.shared]
    assert [group.rows for group in alone] == [[12], [13]]


@pytest.mark.parametrize("budget", [SEQ, 48, 512])
def test_every_row_is_laid_once_and_maps_back_to_itself(budget):
    batch = grouped_batch()
    ids, lengths = batch["input_ids"], batch["input_lengths"].tolist()
    rows = plan_scoring_rows(ids, lengths, budget, multiple=4)
    assert sorted(r for row in rows for r in row.rows) == list(range(len(lengths)))
    for row in rows:
        assert row.forward.input_ids.shape[1] <= max(budget, 4 * ((budget + 3) // 4))
        assert row.forward.input_ids.shape[1] % 4 == 0
        expanded_ids = row.expand(row.forward.input_ids.unsqueeze(-1)).squeeze(-1)
        expanded_positions = row.expand(row.forward.position_ids.unsqueeze(-1)).squeeze(-1)
        for slot, r in enumerate(row.rows):
            n = lengths[r]
            assert torch.equal(expanded_ids[slot, :n], ids[r, :n])
            assert torch.equal(expanded_positions[slot, :n], torch.arange(n))
            assert not expanded_ids[slot, n:].any()
        for start, (first, last) in row.forward.contexts[
            0
        ].items():  # a suffix's prefix precedes it
            assert first < last <= start
    whole = sum(lengths)
    laid = sum(
        int((row.forward.segment_ids[0] != row.forward.segment_ids[0, -1]).sum()) for row in rows
    )
    if budget >= 512:  # every group in one row: each prompt laid once instead of 4 times
        assert laid < whole - sum(3 * (p - 1) for p in PROMPTS)


PACKING = {
    "sequence_packing__enabled": True,
    "sequence_packing__logprob_mb_tokens": 48,
    "sequence_packing__train_mb_tokens": 48,
    "sequence_packing__sequence_length_round": 4,
}


@pytest.mark.parametrize("packed", [False, True], ids=["padded", "packed"])
def test_the_engine_scores_as_it_does_each_row_whole(world1, model_dirs, packed):
    batch = grouped_batch()
    packing = PACKING if packed else {}
    engines, tokens = {}, {}
    for shared in (False, True):
        cfg = policy_config(
            model_dirs["untied"], dtensor_cfg__shared_prefix_scoring=shared, **packing
        )
        engine = DTensorEngine(cfg, world1, torch.device("cpu"), with_optimizer=False)
        assert engine.scores_shared_prefixes == shared
        forward = engine._forward_hidden
        tokens[shared] = 0

        def counted(mb, forward=forward, shared=shared):
            tokens[shared] += int(mb.input_ids.numel())
            return forward(mb)

        engine._forward_hidden = counted
        engines[shared] = engine
    asked = {"topk": 4, "logprobs": True, "hidden": True, "temperature": 0.9}
    whole = engines[False].score(TensorBatch(dict(batch)), **asked)
    mine = engines[True].score(TensorBatch(dict(batch)), **asked)
    assert tokens[True] < tokens[False], tokens
    assert mine.keys() == whole.keys()
    torch.testing.assert_close(mine["hidden_states"], whole["hidden_states"], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(mine["logprobs"], whole["logprobs"], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(mine["topk_logprobs"], whole["topk_logprobs"], rtol=1e-5, atol=1e-5)
    same_ids = mine["topk_indices"] == whole["topk_indices"]
    assert same_ids.float().mean() > 0.999
    trained = engines[True].score(TensorBatch(dict(batch)), topk=4, trained_only=True)
    expected = engines[False].score(TensorBatch(dict(batch)), topk=4, trained_only=True)
    torch.testing.assert_close(
        trained["topk_logprobs"], expected["topk_logprobs"], atol=1e-5, rtol=1e-5
    )


def test_every_dp_rank_runs_as_many_microbatches_as_the_busiest():
    """The busiest rank's count is asked once (a collective: every rank must call it the same
    number of times), and the rank pads with dummies that score nothing."""
    from nemo_opd.policy.engines.shared_prefix import shared_prefix_microbatches

    batch = grouped_batch()
    batch["targets"] = torch.roll(batch["input_ids"], -1, dims=1)
    cfg = policy_config("unused", **PACKING)
    asked = []

    def busiest(count):
        asked.append(count)
        return count + 2

    items = shared_prefix_microbatches(batch, ("targets",), cfg, 1, busiest)
    assert len(asked) == 1 and len(items) == asked[0] + 2
    assert [output.dummy for _, output, _ in items[-2:]] == [True, True]
    assert not any(output.dummy for _, output, _ in items[:-2])
