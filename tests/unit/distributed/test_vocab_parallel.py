"""Log-probs and top-k over a padded vocabulary split across 2 gloo processes equal a
single-process log_softmax over the real columns, also when one shard is all padding."""

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from nemo_opd.distributed.vocab_parallel import vocab_parallel_logprobs, vocab_parallel_topk

WORLD = 2
ROWS, K = 7, 5
VOCABS = (
    301,  # padded to 512: rank 1 holds ids 256..300 and 211 padding columns
    100,  # padded to 256: rank 1's shard (ids 128..255) is padding only
)


def _worker(rank: int, init_file: str, cases: list) -> None:
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=WORLD)
    try:
        for vocab, shards, starts, targets, expected in cases:
            shard, start = shards[rank], starts[rank]
            logprobs = vocab_parallel_logprobs(shard, targets, start, dist.group.WORLD)
            values, ids = vocab_parallel_topk(shard, K, start, dist.group.WORLD)
            ref_logprobs, ref_values, ref_ids = expected
            label = f"vocab {vocab}, rank {rank}"
            torch.testing.assert_close(logprobs, ref_logprobs, msg=label)
            torch.testing.assert_close(values, ref_values, msg=label)
            assert torch.equal(ids.long(), ref_ids), f"{label}: top-k ids differ"
    finally:
        dist.destroy_process_group()


def _case(vocab: int) -> tuple:
    """(vocab, each rank's masked shard, each rank's first id, targets, reference outputs)."""
    from nemo_opd.policy.engines.vocab_padding import mask_padded_logits, padded_vocab_size

    padded = padded_vocab_size(vocab, WORLD)
    gen = torch.Generator().manual_seed(vocab)
    logits = torch.randn(ROWS, padded, generator=gen) * 4  # garbage in the padding columns
    logits[0, vocab - 1] = 30.0  # a row whose maximum is the last real id
    targets = torch.randint(0, vocab, (ROWS,), generator=gen)
    width = padded // WORLD
    starts = [rank * width for rank in range(WORLD)]
    shards = [mask_padded_logits(logits[:, s : s + width], s, vocab) for s in starts]
    reference = torch.log_softmax(logits[:, :vocab], dim=-1)
    expected = (reference.gather(1, targets[:, None]).squeeze(1), *reference.topk(K, dim=-1))
    return vocab, shards, starts, targets, expected


def test_padded_vocabulary_matches_single_process(tmp_path):
    # The shards are built here: the spawned workers import only vocab_parallel.
    cases = [_case(vocab) for vocab in VOCABS]
    mp.spawn(_worker, args=(str(tmp_path / "init"), cases), nprocs=WORLD, join=True)
