"""collection_paused: automatic garbage collection off while a run starts, what survives it
frozen, automatic collection back as it was."""

import gc

import pytest

from nemo_opd.utils.gc_pause import collection_paused


@pytest.fixture(autouse=True)
def _restore_gc():
    enabled = gc.isenabled()
    yield
    gc.unfreeze()
    if enabled:
        gc.enable()


def test_collection_is_off_inside_and_on_again_after():
    gc.enable()
    with collection_paused():
        assert not gc.isenabled()
    assert gc.isenabled()


def test_what_survives_the_block_is_frozen():
    gc.unfreeze()
    with collection_paused():
        kept = [[index] for index in range(1000)]  # tracked containers
    assert gc.get_freeze_count() >= len(kept)
    collected = {id(item) for item in gc.get_objects()}  # the generations a pass walks
    assert not any(id(item) in collected for item in kept)


def test_collection_left_off_when_it_was_off_before():
    gc.disable()
    with collection_paused():
        pass
    assert not gc.isenabled()


def test_an_error_inside_still_restores_collection():
    gc.enable()
    with pytest.raises(RuntimeError, match="inside"), collection_paused():
        raise RuntimeError("inside")
    assert gc.isenabled()
