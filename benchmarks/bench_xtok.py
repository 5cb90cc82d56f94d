"""Benchmark the teacher with another tokenizer on real vocabularies (docs/cross_tokenizer.md).

For each real pair (student <- teacher: Qwen3 <- Llama 3, Qwen3 <- Tekken, Llama 3 <- Qwen3,
Mistral SentencePiece <- Qwen3; the tokenizers built offline by tests/real_tokenizers.py):

  setup      seconds and resident memory added by what setup builds: the byte tables, the
             vocabulary map, the spelling check and the probe (TeacherRendering, vocab_map,
             unspellable, check); the share of the teacher's vocabulary that maps.
  driver     microseconds per student position (CPU time of the driver's process, one torch
             thread; all its
             threads, and wall time) of what the driver does per step: render the rows
             for the teacher and align them (teacher_rows), move a top-k of width k onto the
             student's positions and vocabulary (topk_to_student, the teacher's top-k random)
             and spread sampled log-probs (logprobs_to_student); rows of --length tokens of
             mixed text (prose, LaTeX, code, numbers, CJK, emoji).
  graded     the share of the student's response positions that get a teacher distribution.

    uv run --extra cpu python benchmarks/bench_xtok.py            # --rows 16 --length 4096
"""

import argparse
import gc
import json
import random
import sys
import time
from pathlib import Path

import psutil
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

import real_tokenizers  # noqa: E402

from nemo_opd.data.chat import ChatFormatter  # noqa: E402
from nemo_opd.teachers.cross_tokenizer import TeacherRendering  # noqa: E402

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
        turn = {"role": "assistant", "content": "", "token_ids": ids}
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
    return rendering, {
        "setup_s": round(seconds, 2),
        "setup_rss_mib": round((process.memory_info().rss - before) / 2**20, 1),
        "map_mib": round(vocab.teacher_to_student.numel() * 8 / 2**20, 2),
        "teacher_vocab_mapped": round(vocab.coverage(), 4),
        "unspellable": len(unspellable),
    }


def _driver(rendering: TeacherRendering, logs, k: int) -> dict:
    width = max(sum(len(m["token_ids"]) for m in log) for log in logs)
    clock = _Clock()
    rows = rendering.teacher_rows(logs)
    render = clock.lap()
    shape = rows.batch["input_ids"].shape
    gen = torch.Generator().manual_seed(0)
    values = torch.log_softmax(torch.randn(*shape, k, generator=gen), -1)
    indices = torch.randint(0, len(rendering.teacher), (*shape, k), generator=gen)
    clock.lap()
    rows.topk_to_student(values, indices.int(), width, rendering.vocab_map())
    rows.logprobs_to_student(values[..., 0], width)
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
    parser.add_argument("--rows", type=int, default=16)
    parser.add_argument("--length", type=int, default=4096, help="student tokens per response")
    parser.add_argument("--k", type=int, default=64)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    torch.set_num_threads(1)  # CPU time per position without the thread pool's spinning
    results = []
    for student_name, teacher_name in PAIRS:
        student, teacher = real_tokenizers.load(student_name), real_tokenizers.load(teacher_name)
        rendering, setup = _setup(student, teacher)
        driver = _driver(rendering, _logs(student, args.rows, args.length), args.k)
        result = {"student": student_name, "teacher": teacher_name, **setup, **driver}
        results.append(result)
        print(json.dumps(result), flush=True)
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
