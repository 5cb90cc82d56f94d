"""Benchmark the teacher with another tokenizer on real vocabularies (docs/cross_tokenizer.md).

For each real pair (student <- teacher: Qwen3 <- Llama 3, Qwen3 <- Tekken, Llama 3 <- Qwen3,
Mistral SentencePiece <- Qwen3; the tokenizers built offline by tests/real_tokenizers.py):

  setup      seconds and resident memory added by what setup builds: the byte tables, the
             vocabulary map, the spelling check and the probe (TeacherRendering, vocab_map,
             unspellable, check); the share of the teacher's vocabulary that maps; the MiB
             of the rendering as it is sent to each of an in-process teacher's workers, once,
             and the seconds a worker takes to read it.
  work       microseconds per student position (CPU time of this process, one torch thread,
             all its threads; and wall time) of the path's work per step, wherever it runs (a
             served teacher's on the driver, an in-process teacher's in its workers): render
             the rows for the teacher and align them (teacher_rows), move a top-k of width k
             onto the student's positions and vocabulary (topk_to_student, the teacher's top-k
             random), spread sampled log-probs (logprobs_to_student) and count the rows for
             the metrics (counts); rows of --length tokens of mixed text (prose, LaTeX, code,
             numbers, CJK, emoji).
  driver     the driver's CPU (and wall) seconds per step of --step-rows responses of --length
             tokens (512 x 4,096 by default) with an in-process teacher, whose --dp workers do
             the work above (what setup builds: CrossTokenizerTeacher.score through
             Policy.score_rendered), the workers played by _OfflinePolicy (each shard
             serialized as ray.put does it, with pickle; canned answers of the right shapes
             back): the conversations stripped of their generation log-probs, cut into the
             workers' shards and serialized ("ship", and the MiB shipped), the answers joined
             ("join": the same for a teacher of the student's own tokenizer) and counted.
             Ray's own transport (the copy into its object store, the answers' way back) is
             not in it.
  served     the driver's thread CPU (time.thread_time, the brief's figure), its process's CPU
             (all its threads: the tokenizer's Rust core runs on threads of its own) and the
             wall seconds per step of --step-rows responses of --length tokens with a served
             teacher, whose every row the run renders, has scored and maps: on the driver's
             thread ("thread", teacher.server.render_workers 0) and in --render-workers render
             workers ("pool", nemo_opd.scoring.render_pool), the answers then read once (a
             first touch of each of their pages, which the pool's mapped answers pay on the
             driver). The teacher's answers come from _CannedTeacher (the same top-k at every
             row, at no cost), so the server's own part (its replies read, in the workers with
             the pool) is not in it; the pool's answers are checked equal to the thread's, bit
             for bit; the workers' peak resident memory (VmHWM, Linux).
  graded     the share of the student's response positions that get a teacher distribution.

    uv run --extra cpu python benchmarks/bench_xtok.py    # --rows 16 --step-rows 512 --length 4096
    uv run --extra cpu python benchmarks/bench_xtok.py --sections served --pairs qwen3:llama3
"""

import argparse
import gc
import json
import os
import pickle
import random
import sys
import time
from pathlib import Path

import psutil
import torch

HERE = str(Path(__file__).resolve().parent)
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

import real_tokenizers  # noqa: E402
from harness import run_meta  # noqa: E402

from nemo_opd.data.chat import ChatFormatter  # noqa: E402
from nemo_opd.data.message_log import flatten_message_logs  # noqa: E402
from nemo_opd.distributed.parallel_dims import ParallelDims  # noqa: E402
from nemo_opd.policy.policy import Policy, joined  # noqa: E402
from nemo_opd.scoring.base import Rollouts, TeacherNeed, TeacherScores  # noqa: E402
from nemo_opd.scoring.render_pool import RenderPool  # noqa: E402
from nemo_opd.scoring.rendering import TeacherRendering  # noqa: E402
from nemo_opd.scoring.xtok_rows import COUNTS  # noqa: E402
from nemo_opd.teachers.cross_tokenizer import CrossTokenizerTeacher  # noqa: E402

PAIRS = [("qwen3", "llama3"), ("qwen3", "tekken"), ("llama3", "qwen3"), ("mistral_sp", "qwen3")]
PROSE = (
    "The derivative of a product is found with the product rule, and each term is checked "
    "against the original function before the final answer is written down. "
)


def _text(length_chars: int, seed: int) -> str:
    """Mixed text of about `length_chars` characters."""
    rng = random.Random(seed)
    pieces = [PROSE, *real_tokenizers.HOSTILE_TEXTS, f"{rng.randint(0, 10**12)} "]
    out = []
    while sum(map(len, out)) < length_chars:
        out.append(rng.choice(pieces))
        out.append(f" {rng.randint(0, 99999)} * {rng.randint(0, 999)} = ")
    return "".join(out)


def _logs(student, rows: int, length: int) -> list[list[dict]]:
    formatter = ChatFormatter(student)
    logs = []
    for row in range(rows):
        ids = student(_text(length * 4, seed=row), add_special_tokens=False)["input_ids"]
        ids = [*ids[:length], student.eos_token_id]
        turn = {
            "role": "assistant",
            "content": student.decode(ids[:-1]),  # shipped to the workers with the ids
            "token_ids": ids,
            "generation_logprobs": [-0.5] * len(ids),
        }
        logs.append([*formatter.prompt_log(f"Problem {row}: compute 7 * 6."), turn])
    return logs


def _setup(student, teacher) -> tuple[TeacherRendering, dict]:
    gc.collect()
    process = psutil.Process()
    before, start = process.memory_info().rss, time.perf_counter()
    rendering = TeacherRendering(student, ChatFormatter(teacher))
    vocab = rendering.vocab_map()
    unspellable = rendering.unspellable()
    rendering.check()
    seconds = time.perf_counter() - start
    sent = pickle.dumps(rendering, protocol=5)  # as each worker of an in-process teacher gets it
    start = time.perf_counter()
    pickle.loads(sent)
    read = time.perf_counter() - start
    return rendering, {
        "setup_s": round(seconds, 2),
        "setup_rss_mib": round((process.memory_info().rss - before) / 2**20, 1),
        "map_mib": round(vocab.teacher_to_student.numel() * 8 / 2**20, 2),
        "teacher_vocab_mapped": round(vocab.coverage(), 4),
        "unspellable": len(unspellable),
        "rendering_mib": round(len(sent) / 2**20, 1),
        "rendering_read_s": round(read, 2),
    }


def _work(rendering: TeacherRendering, logs, k: int) -> dict:
    """The path's work per position: render and align; move the top-k and log-probs."""
    width = max(sum(len(m["token_ids"]) for m in log) for log in logs)
    student_rows = flatten_message_logs(logs, 0)
    clock = _Clock()
    rows = rendering.teacher_rows(logs)
    render = clock.lap()
    shape = rows.batch["input_ids"].shape
    gen = torch.Generator().manual_seed(0)
    values = torch.log_softmax(torch.randn(*shape, k, generator=gen), -1)
    indices = torch.randint(0, len(rendering.teacher), (*shape, k), generator=gen)
    clock.lap()
    moved = rows.topk_to_student(values, indices.int(), width, rendering.vocab_map())
    rows.logprobs_to_student(values[..., 0], width)
    rows.counts(student_rows["token_mask"], (values, moved[0]))
    move = clock.lap()
    positions = sum(len(log[-1]["token_ids"]) for log in logs)
    source = rows.source_positions(width)
    graded = sum(
        int((source[row, len(log[0]["token_ids"]) - 1 : width - 1] >= 0).sum())
        for row, log in enumerate(logs)
    )
    per = 1e6 / positions
    return {
        "positions": positions,
        "render_align_cpu_us": round(render[1] * per, 2),
        "render_align_wall_us": round(render[0] * per, 2),
        "topk_move_cpu_us": round(move[1] * per, 2),
        "topk_move_wall_us": round(move[0] * per, 2),
        "graded_share": round(graded / positions, 4),
        "unrendered_rows": rows.unrendered,
    }


def _driver(rendering: TeacherRendering, logs, k: int, dp: int) -> dict:
    """The driver's share of a step when the workers do the work (module docstring)."""
    rows = flatten_message_logs(logs, 0)
    workers = _OfflinePolicy(dp, rows["input_ids"].shape, k)
    teacher = CrossTokenizerTeacher(None, rendering, workers=workers)
    rollouts = Rollouts(rows, logs, [{}] * len(logs))
    need = TeacherNeed(topk=k, sampled=True)
    clock = _Clock()
    teacher.score(rollouts, need)
    wall, cpu = clock.lap()
    joined(workers.answers, len(logs))  # the join alone, as any teacher's answers are joined
    join = clock.lap()
    per = 1e6 / sum(len(log[-1]["token_ids"]) for log in logs)
    return {
        "step_rows": len(logs),
        "driver_step_cpu_s": round(cpu, 3),
        "driver_step_wall_s": round(wall, 3),
        "driver_ship_cpu_s": round(workers.ship[1], 3),
        "driver_join_cpu_s": round(join[1], 3),
        "shipped_mib": round(workers.shipped / 2**20, 1),
        "driver_cpu_us": round(cpu * per, 3),
    }


class _OfflinePolicy(Policy):
    """A teacher's Policy whose workers are played here: score_rendered as the Policy runs it,
    each shard serialized as ray.put serializes it (pickle) and answers of the shapes the
    workers send (rows in the student's positions)."""

    def __init__(self, dp: int, shape: tuple[int, int], k: int) -> None:
        self.dims = ParallelDims(dp)
        rows, width = -(-shape[0] // dp), shape[1]
        answer = {
            "topk_logprobs": torch.randn(rows, width, k),
            "topk_indices": torch.randint(0, 1000, (rows, width, k), dtype=torch.int32),
            "logprobs": torch.randn(rows, width),
            "xtok_counts": torch.ones(rows, len(COUNTS), dtype=torch.float64),
        }
        self.answers = [answer] * dp
        self.ship, self.shipped = (0.0, 0.0), 0

    def set_rendering(self, rendering: TeacherRendering) -> None:
        pass  # once per run, at the first step

    def _run_on_replicas(self, shards: list, call) -> list:
        clock = _Clock()
        self.shipped = sum(len(pickle.dumps(shard, protocol=5)) for shard in shards)
        self.ship = clock.lap()
        return self.answers


def _served(rendering: TeacherRendering, logs, k: int, workers: int) -> dict:
    """A served teacher's step on the driver's thread and in the pool (module docstring)."""
    rows = flatten_message_logs(logs, 0)
    rollouts = Rollouts(rows, logs, [{}] * len(logs))
    need = TeacherNeed(topk=k, sampled=True)
    vocab = len(rendering.teacher)
    # the workers import this module by name to read its teacher (not as __main__)
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [HERE, os.environ.get("PYTHONPATH")]))
    from bench_xtok import _CannedTeacher

    in_thread = CrossTokenizerTeacher(_CannedTeacher(vocab, k), rendering)
    thread, expected = _timed_score(in_thread, rollouts, need)
    pool = RenderPool(rendering, [_CannedTeacher(vocab, k) for _ in range(workers)])
    pooled = CrossTokenizerTeacher(_CannedTeacher(vocab, k), rendering, pool=pool)
    try:
        pooled.score(rollouts.select(torch.arange(min(workers, len(logs)))), need)  # started
        in_pool, got = _timed_score(pooled, rollouts, need)
        workers_rss = [_peak_rss(pid) for pid in pool.pids()]
    finally:
        pooled.shutdown()
    same = all(torch.equal(got.tensors()[n], t) for n, t in expected.tensors().items())
    out = {"render_workers": workers, "pool_equals_thread": same}
    for name, (thread_cpu, process_cpu, wall) in (("thread", thread), ("pool", in_pool)):
        out[f"served_{name}_driver_thread_cpu_s"] = round(thread_cpu, 3)
        out[f"served_{name}_driver_process_cpu_s"] = round(process_cpu, 3)
        out[f"served_{name}_wall_s"] = round(wall, 2)
    out["served_pool_worker_peak_rss_mib"] = round(max(workers_rss) / 2**20)
    return out


def _peak_rss(pid: int) -> int:
    """A process's peak resident set so far (VmHWM), bytes."""
    status = Path(f"/proc/{pid}/status").read_text()
    line = next(line for line in status.splitlines() if line.startswith("VmHWM:"))
    return int(line.split()[1]) * 1024


def _timed_score(teacher, rollouts, need) -> tuple[tuple[float, float, float], TeacherScores]:
    """(the driver thread's CPU, its process's CPU, wall) seconds of one score() and a first
    read of every page of its answers; the answers."""
    thread, process, wall = time.thread_time(), time.process_time(), time.perf_counter()
    scores = teacher.score(rollouts, need)
    for tensor in scores.tensors().values():
        tensor.view(-1)[:: 4096 // tensor.element_size()].sum()  # one element per page
    teacher.take_metrics()
    spent = (time.thread_time() - thread, time.process_time() - process)
    return (*spent, time.perf_counter() - wall), scores


class _CannedTeacher:
    """A teacher that answers any rows at no cost: the same descending top-k log-probs and the
    same random ids at every position (its memory one row's), log-probs of -1. Run by the
    pool's workers too, which import it from this module."""

    def __init__(self, vocab_size: int, k: int) -> None:
        self.vocab_size, self.k = vocab_size, k
        self._ids = torch.zeros(0, k, dtype=torch.int32)

    def score(self, rollouts: Rollouts, need: TeacherNeed) -> TeacherScores:
        rows, width = rollouts.batch["input_ids"].shape
        if self._ids.shape[0] < width:
            gen = torch.Generator().manual_seed(0)
            ids = torch.randint(0, self.vocab_size, (width, self.k), generator=gen)
            self._ids = ids.to(torch.int32)
        levels = torch.log_softmax(torch.arange(self.k + 1, 0, -1).float(), -1)[: self.k]
        return TeacherScores(
            topk_logprobs=levels.expand(rows, width, self.k) if need.topk else None,
            topk_indices=self._ids[:width].expand(rows, width, self.k) if need.topk else None,
            logprobs=torch.full((rows, width), -1.0) if need.sampled else None,
        )

    def take_metrics(self) -> dict[str, float]:
        return {}

    def longest_wait_s(self, rows: int) -> float:
        return 0.0

    def shutdown(self) -> None:
        pass


class _Clock:
    """Wall and CPU (this process, all threads) seconds since the last lap."""

    def __init__(self) -> None:
        self.wall, self.cpu = time.perf_counter(), time.process_time()

    def lap(self) -> tuple[float, float]:
        wall, cpu = time.perf_counter(), time.process_time()
        out = (wall - self.wall, cpu - self.cpu)
        self.wall, self.cpu = wall, cpu
        return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=16, help="responses for setup and work")
    parser.add_argument("--step-rows", type=int, default=512, help="responses of the driver's step")
    parser.add_argument("--length", type=int, default=4096, help="student tokens per response")
    parser.add_argument("--k", type=int, default=64)
    parser.add_argument("--dp", type=int, default=2, help="the teacher's data-parallel workers")
    parser.add_argument("--render-workers", type=int, default=2, help="the served step's pool")
    parser.add_argument(
        "--sections", default="work,driver,served", help="which of work, driver, served to run"
    )
    parser.add_argument(
        "--pairs",
        default=",".join(f"{s}:{t}" for s, t in PAIRS),
        help="student:teacher pairs, comma-separated",
    )
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    sections = set(args.sections.split(","))
    torch.set_num_threads(1)  # CPU time per position without the thread pool's spinning
    results = []
    for pair in args.pairs.split(","):
        student_name, teacher_name = pair.split(":")
        student, teacher = real_tokenizers.load(student_name), real_tokenizers.load(teacher_name)
        rendering, result = _setup(student, teacher)
        result = {"student": student_name, "teacher": teacher_name, **result}
        if "work" in sections:
            result.update(_work(rendering, _logs(student, args.rows, args.length), args.k))
        step = _logs(student, args.step_rows, args.length)
        if "driver" in sections:
            result.update(_driver(rendering, step, args.k, args.dp))
        if "served" in sections:
            result.update(_served(rendering, step, args.k, args.render_workers))
        del step
        results.append(result)
        print(json.dumps(result), flush=True)
    if args.json:
        args.json.write_text(json.dumps({"meta": run_meta(), "results": results}, indent=1))


if __name__ == "__main__":
    main()
