"""DistillationRun.shutdown stops every part even when one fails to stop: the other workers,
the environments and the placement group are still stopped, the logger still closed and the
run's lock still released, and the first failure is raised after them (the others noted)."""

import gc
import weakref

import pytest
import ray
from ray.util.placement_group import placement_group, placement_group_table

from nemo_opd.algorithms.run_state import DistillationRun
from nemo_opd.config import LoggerConfig
from nemo_opd.utils.logger import Logger
from nemo_opd.utils.run_dirs import RunLock

pytestmark = pytest.mark.usefixtures("ray_session")  # a Ray to hold the runs' placement groups


class Part:
    """A worker (or environment) whose shutdown records that it ran, and raises `error` if
    given one (a worker that fails to stop: an engine's kill refused, a pool that hangs)."""

    def __init__(self, error: Exception | None = None):
        self.error = error
        self.stopped = False

    def shutdown(self):
        self.stopped = True
        if self.error is not None:
            raise self.error


def a_run(tmp_path, generation: Part, student: Part, environment: Part) -> DistillationRun:
    lock = RunLock(tmp_path / "checkpoints")
    lock.acquire()
    logger = Logger(LoggerConfig(log_dir=str(tmp_path / "logs")))
    placement = placement_group([{"CPU": 1}])
    ray.get(placement.ready(), timeout=60)
    unused = dict.fromkeys(
        ("cfg", "formatter", "train_prompts", "val_prompts", "loader", "loss_fn"), None
    )
    return DistillationRun(
        **unused,
        environments={"math": environment},
        student=student,
        teacher=None,
        generation=generation,
        val_loss_fn=None,
        logger=logger,
        checkpoints=None,
        placement=placement,
        lock=lock,
    )


def test_a_part_that_fails_to_stop_stops_nothing_else(tmp_path):
    generation = Part(RuntimeError("vLLM engine 0 refused to stop"))
    student, environment = Part(), Part(OSError("the grader pool's pipe is closed"))
    run = a_run(tmp_path, generation, student, environment)
    with pytest.raises(RuntimeError, match="engine 0 refused") as raised:
        run.shutdown()
    assert student.stopped and environment.stopped
    assert "also while shutting down: OSError: the grader pool's pipe is closed" in (
        raised.value.__notes__
    )
    state = placement_group_table(run.placement)["state"]
    assert state == "REMOVED"
    assert run.logger._backends == []  # closed: metrics.jsonl flushed and its handle shut
    again = RunLock(tmp_path / "checkpoints")
    again.acquire()  # released: a SetupError "in use by another run" if it were still held
    again.release()


def test_what_setup_froze_is_collected_at_shutdown(tmp_path):
    """setup freezes what it built (utils/gc_pause.py); once the run stops, its parts' memory
    held in reference cycles goes back to the collector, and is collected."""

    class Engine:  # an engine's objects refer to each other
        pass

    run = a_run(tmp_path, Part(), Part(), Part())
    engine = Engine()
    engine.itself = engine
    freed = weakref.ref(engine)
    gc.freeze()
    del engine
    run.shutdown()
    assert freed() is None and gc.get_freeze_count() == 0
