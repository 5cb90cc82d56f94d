import itertools

import pytest

from nemo_opd.data.prompt_loader import PromptLoader

RECORDS = [{"prompt": str(i), "answer": str(i)} for i in range(10)]


def _take(loader, n):
    return [[r["prompt"] for r in b] for b in itertools.islice(iter(loader), n)]


def test_epochs_cover_every_full_batch_in_a_new_order():
    loader = PromptLoader(RECORDS, 3, shuffle=True, seed=0)
    batches = _take(loader, 6)  # 3 batches per epoch, the 10th record dropped each epoch
    first, second = batches[:3], batches[3:]
    assert len({p for b in first for p in b}) == 9
    assert first != second
    assert loader.state_dict() == {"epoch": 2, "batch_index": 0}


def test_resume_continues_the_same_sequence():
    reference = _take(PromptLoader(RECORDS, 4, shuffle=True, seed=7), 7)
    loader = PromptLoader(RECORDS, 4, shuffle=True, seed=7)
    head = _take(loader, 3)
    resumed = PromptLoader(RECORDS, 4, shuffle=True, seed=7)
    resumed.load_state_dict(loader.state_dict())
    assert head + _take(resumed, 4) == reference


def test_no_shuffle_keeps_order():
    assert _take(PromptLoader(RECORDS, 5, shuffle=False, seed=0), 2) == [
        ["0", "1", "2", "3", "4"],
        ["5", "6", "7", "8", "9"],
    ]


def test_too_few_records():
    with pytest.raises(ValueError, match="cannot fill one batch of 11"):
        PromptLoader(RECORDS, 11, shuffle=False, seed=0)
