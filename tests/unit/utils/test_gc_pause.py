"""collection_paused: automatic garbage collection off while a run starts, what survives it
frozen, automatic collection back as it was. collections_deferred: gc.collect() a no-op in the
block, one full collection at its end."""

import contextlib
import gc
import weakref

import pytest

from nemo_opd.utils.gc_pause import collection_paused, collections_deferred


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


class _Node:
    """An object a reference cycle can hold (and a weak reference can watch)."""


def _garbage_cycle() -> weakref.ref:
    """A reference cycle nothing else refers to: only a collection frees it."""
    node = _Node()
    node.self = node
    return weakref.ref(node)


@pytest.mark.parametrize("raises", [False, True])
def test_collections_inside_are_deferred_to_one_at_the_end(raises):
    collect = gc.collect
    gc.unfreeze()
    expected = pytest.raises(RuntimeError) if raises else contextlib.nullcontext()
    with expected, collections_deferred():
        cycle = _garbage_cycle()
        assert gc.collect() == 0 and gc.collect(2) == 0
        assert cycle() is not None  # not collected inside
        if raises:
            raise RuntimeError("inside")
    assert cycle() is None  # collected at the end
    assert gc.collect is collect
