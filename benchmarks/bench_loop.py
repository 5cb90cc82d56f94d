"""The distillation loop on one device in one process: the GPU lane's loop steps
(benchmarks/gpu_lane.sh g_loop and h_shapes), dry-run on a CPU at tiny shapes.

    # (a) the tiny default end to end, as a user runs it, on the device, in one process
    python benchmarks/bench_loop.py tiny --device cuda --reference-accuracy 0.6 --json tiny.json
    # (b) the single-GPU recipe's models with random weights: seconds per phase, peak memory
    python benchmarks/bench_loop.py shapes --device cuda --json shapes.json
    # the same on a CPU at tiny shapes (the lane's dry run)
    python benchmarks/bench_loop.py tiny --device cpu --steps 3 --val-samples 32
    python benchmarks/bench_loop.py shapes --device cpu --student tiny --teacher tiny ...

tiny: the command `examples/run_distillation_math.py --config distillation_tiny.yaml` in a
process of its own, with what one device needs: cluster.device (the device), the local
executor (no Ray: the student, the teacher and the engine in that one process), the
transformers generation backend (no vLLM), and lockstep (distillation.max_staleness 0:
colocated generation cannot overlap training on one GPU; the engine then generates from the
student's own module, so a refit copies nothing). Everything else is the shipped default's
(350 steps, validations of the 500 held-out problems at steps 0, 175 and 350). The table: the
whole command's seconds, start-up, the mean step and its phases, the held-out accuracy at each
validation and its difference from --reference-accuracy (the same command's on a CPU). Exit
status 1 when the command fails, stops at --deadline-s (the table then shows how far it got),
or ends more than --tolerance from the reference.

shapes: the single-GPU recipe's models (examples/configs/distillation_math_1gpu.yaml) with
random weights: a Qwen3-1.7B-Base-shaped student and a Qwen3-8B-shaped teacher, their configs
written here from the published shapes (SHAPES) and saved with save_pretrained (no download).
They are driven through the objects a run in one process builds: the student and the teacher
as Policy objects on the local executor (the DTensor engine: the student in bf16 with float32
master weights and activation checkpointing, the teacher held in bf16), and the transformers
generation engine reading the student's own module. Each step: refit (records the version:
nothing to copy), generation of --rows rollouts of random prompts, the teacher's top-k over
them, one optimizer step of the student on them (sequence-packed); the table has each phase's
seconds and peak memory, tokens per second, and the training tokens per second against the
engine alone's (ENGINE_ALONE_TOKENS_PER_S, the lane's d_engine step). Then, once, what a
copying refit would start with: gathering the student's weights (Policy.full_weights_ref).
"""

import argparse
import itertools
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from bench_engine import sync  # noqa: E402

TINY_CONFIG = ROOT / "examples" / "configs" / "distillation_tiny.yaml"
ONE_DEVICE = (
    "cluster.executor=local",
    "policy.generation.backend=transformers",
    "distillation.max_staleness=0",
)
"""What the tiny default needs on one device without Ray and vLLM (module docstring)."""
PHASES = {
    "generation": "timing/train/generation",
    "refit": "timing/train/refit",
    "teacher": "timing/train/teacher_topk",
    "training": "timing/train/policy_training",
    "step": "timing/train/total_step_time",
}
"""The tiny run's per-step metrics the table reports, by the name it shows."""
TABLE_PHASES = ("step", "generation", "refit", "teacher", "training")
STARTUP_METRIC = "timing/startup/driver/setup_done"
ENGINE_ALONE_TOKENS_PER_S = 11410
"""Training tokens/s of the DTensor engine alone at Qwen3-1.7B's shape (bf16, packed
microbatches of 4,096 tokens, no activation checkpointing): docs/benchmarks.md, GPU results d."""
SHAPES = {
    "qwen3-1.7b-base": dict(
        hidden_size=2048, intermediate_size=6144, num_hidden_layers=28, num_attention_heads=16,
        num_key_value_heads=8, head_dim=128, vocab_size=151936, tie_word_embeddings=True,
        max_position_embeddings=32768, rope_theta=1000000.0, rms_norm_eps=1e-6,
        bos_token_id=151643, eos_token_id=151643,
    ),
    "qwen3-8b": dict(
        hidden_size=4096, intermediate_size=12288, num_hidden_layers=36, num_attention_heads=32,
        num_key_value_heads=8, head_dim=128, vocab_size=151936, tie_word_embeddings=False,
        max_position_embeddings=40960, rope_theta=1000000.0, rms_norm_eps=1e-6,
        bos_token_id=151643, eos_token_id=151645,
    ),
    "tiny": dict(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, vocab_size=1024, tie_word_embeddings=True,
        max_position_embeddings=512, rms_norm_eps=1e-6,
    ),
}  # fmt: skip
"""Qwen3 configs as the published checkpoints' config.json give them (the shapes that set the
memory and the arithmetic); tiny for a dry run."""


# ------------------------------------------------------------------------------- (a) tiny


def tiny(args) -> int:
    """The tiny default's command on --device (module docstring); 0 when it ran to the end
    within --tolerance of --reference-accuracy."""
    run_dir = Path(args.run_dir or tempfile.mkdtemp(prefix="bench_loop_tiny."))
    run_dir.mkdir(parents=True, exist_ok=True)
    command = [
        sys.executable, str(ROOT / "examples" / "run_distillation_math.py"),
        "--config", str(TINY_CONFIG), f"cluster.device={args.device}", *ONE_DEVICE,
        f"checkpointing.checkpoint_dir={run_dir / 'checkpoints'}",
        f"logger.log_dir={run_dir / 'logs'}", "logger.console_progress=false",
    ]  # fmt: skip
    if args.steps is not None:
        command += [f"distillation.max_num_steps={args.steps}"]
        command += [
            f"distillation.val_period={args.steps}",
            f"checkpointing.save_period={args.steps}",
        ]
    if args.val_samples is not None:
        command += [f"distillation.max_val_samples={args.val_samples}"]
        command += [f"distillation.val_batch_size={args.val_samples}"]
    print(" ".join(command[1:]), flush=True)
    started = time.perf_counter()
    status = _run_until(command, args.deadline_s, run_dir / "command.log")
    seconds = time.perf_counter() - started
    metrics = _read_metrics(run_dir / "logs" / "metrics.jsonl")
    output = (run_dir / "command.log").read_text()
    record = _tiny_record(args, status, seconds, metrics)
    # what the run said it started: the executor, the engine, whether it reads the student
    record["workers"] = _said(output, "workers: ")
    print(output[-3000:] if status != 0 else "", flush=True)
    print(_tiny_table(record))
    _write_json(args.json, record)
    return 0 if record["passed"] else 1


def _said(output: str, head: str) -> str | None:
    """The run's line that starts with `head`, its wrapped rest (lines indented by two
    spaces) joined back on, or None."""
    lines = output.splitlines()
    for index, line in enumerate(lines):
        if line.startswith(head):
            rest = itertools.takewhile(lambda x: x.startswith("  "), lines[index + 1 :])
            return " ".join([line, *(part.strip() for part in rest)])
    return None


def _run_until(command: list[str], deadline_s: float, log: Path) -> int | str:
    """The command's exit status, or "deadline" when it was stopped (SIGTERM, then SIGKILL)
    after deadline_s seconds; its output goes to `log`."""
    with log.open("w") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT)
        try:
            return process.wait(timeout=deadline_s)
        except subprocess.TimeoutExpired:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=20)
            return "deadline"


def _read_metrics(path: Path) -> dict[int, dict]:
    """{step: the step's records merged} of a run's metrics.jsonl ({} when there is none)."""
    by_step: dict[int, dict] = {}
    for line in path.read_text().splitlines() if path.exists() else []:
        record = json.loads(line)
        by_step.setdefault(record["step"], {}).update(record)
    return by_step


def _tiny_record(args, status: int | str, seconds: float, metrics: dict[int, dict]) -> dict:
    """What the table shows, and whether the run passed."""
    trained = sorted(step for step in metrics if step > 0)
    phases = {
        name: statistics.mean(metrics[s][key] for s in trained if key in metrics[s])
        for name, key in PHASES.items()
        if any(key in metrics[s] for s in trained)
    }
    accuracy = {
        s: m["validation/accuracy"] for s, m in metrics.items() if "validation/accuracy" in m
    }
    final = (
        accuracy[max(accuracy)] if accuracy and trained and max(accuracy) == trained[-1] else None
    )
    difference = None
    if final is not None and args.reference_accuracy is not None:
        difference = final - args.reference_accuracy
    first = metrics.get(min(metrics), {}) if metrics else {}
    device = torch.cuda.get_device_name() if args.device == "cuda" else "cpu"
    finished = status == 0 and final is not None
    within = difference is None or abs(difference) <= args.tolerance
    return {
        "device": device, "status": status, "command_s": round(seconds, 1),
        "startup_s": first.get(STARTUP_METRIC), "steps": trained[-1] if trained else 0,
        "phases_s": {name: round(value, 4) for name, value in phases.items()},
        "accuracy": accuracy, "reference_accuracy": args.reference_accuracy,
        "difference": difference, "tolerance": args.tolerance,
        "passed": finished and within,
    }  # fmt: skip


def _tiny_table(record: dict) -> str:
    """The lane's table of the tiny run."""
    phases = record["phases_s"]
    accuracy = " / ".join(f"{100 * a:.1f}% ({s})" for s, a in sorted(record["accuracy"].items()))
    reference = record["reference_accuracy"]
    cells = [f"{phases[n]:.4f}" if n in phases else "-" for n in TABLE_PHASES]
    lines = [
        f"tiny default on {record['device']}: one process (local executor), transformers "
        "engine reading the student's module, lockstep",
        f"the run said: {record.get('workers') or 'no workers line'}",
        "| steps | command s | start-up s | step s | generation | refit | teacher | training |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
        f"| {record['steps']} | {record['command_s']} | {record['startup_s']} | "
        + " | ".join(cells)
        + " |",
    ]
    lines.append(f"held-out accuracy (step): {accuracy or 'none logged'}")
    if reference is not None:
        difference = record["difference"]
        shown = "-" if difference is None else f"{100 * difference:+.1f} points"
        lines.append(
            f"CPU reference {100 * reference:.1f}%: {shown} (tolerance "
            f"{100 * record['tolerance']:.0f} points)"
        )
    lines.append(f"status: {record['status']}, {'PASS' if record['passed'] else 'FAIL'}")
    return "\n".join(lines)


# ------------------------------------------------------------------------------- (b) shapes


def shapes(args) -> int:
    """The recipe's models with random weights through the loop's phases (module docstring)."""
    device = torch.device(args.device)
    with tempfile.TemporaryDirectory(dir=args.tmp) as tmp:
        started = time.perf_counter()
        student_dir = save_model(args.student, Path(tmp) / "student", device, seed=0)
        teacher_dir = save_model(args.teacher, Path(tmp) / "teacher", device, seed=1)
        saved_s = time.perf_counter() - started
        run = OneProcessRun(args, student_dir, teacher_dir)
        built_s = time.perf_counter() - started - saved_s
    try:
        steps = [run.step(step) for step in range(args.warmup + args.steps)][args.warmup :]
        gather_s = _timed(device, run.student.full_weights_ref)[0] if args.copy_refit else None
    finally:
        run.shutdown()
    sync(device)
    record = _shapes_record(args, steps, saved_s, built_s, gather_s)
    print(_shapes_table(record))
    _write_json(args.json, record)
    return 0 if all(s["loss_finite"] for s in steps) else 1


def save_model(shape: str, path: Path, device, seed: int) -> str:
    """A Qwen3 model of SHAPES[shape] with random weights, saved in bf16 (built on `device`:
    fast on a GPU); returns its directory."""
    from transformers import AutoModelForCausalLM, Qwen3Config

    torch.manual_seed(seed)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(Qwen3Config(**SHAPES[shape]), dtype=torch.bfloat16)
    model.save_pretrained(path)
    del model
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return str(path)


class OneProcessRun:
    """The student, the teacher and the generation engine of a run in one process, built as
    setup builds them for distillation_math_1gpu.yaml (local executor, the engine reading
    the student's module)."""

    def __init__(self, args, student_dir: str, teacher_dir: str) -> None:
        from nemo_opd.config import ClusterConfig, PolicyConfig
        from nemo_opd.generation import VllmGeneration
        from nemo_opd.losses import DistillationLossFn, TopkKLParams
        from nemo_opd.policy.policy import Policy

        self.args = args
        self.device = torch.device(args.device)
        seq = args.prompt_len + args.new_tokens
        cluster = ClusterConfig(device=args.device, executor="local", cpus_per_worker=args.threads)
        packed = {"enabled": True, "train_mb_tokens": 4 * seq, "logprob_mb_tokens": 4 * seq}
        common = {
            "precision": args.precision, "max_total_sequence_length": seq,
            "logprob_batch_size": 4, "sequence_packing": packed,
            "dtensor_cfg": {"activation_checkpointing": True},
        }  # fmt: skip
        student_cfg = PolicyConfig.model_validate(
            {
                "model_name": student_dir, "tokenizer": {"name": student_dir}, **common,
                "train_global_batch_size": args.rows, "train_micro_batch_size": 4,
                "optimizer": {"lr": 1e-6}, "scheduler": {"warmup_steps": 0},
                "generation": {
                    "backend": "transformers", "max_new_tokens": args.new_tokens,
                    "vllm_cfg": {"max_model_len": seq},
                    "transformers_cfg": {"precision": args.precision,
                                         "max_batch_tokens": args.max_batch_tokens},
                },
            }
        )  # fmt: skip
        teacher_cfg = PolicyConfig.model_validate(
            {"model_name": teacher_dir, "tokenizer": {"name": teacher_dir}, **common,
             "optimizer": None, "scheduler": None}
        )  # fmt: skip
        self.student = Policy(student_cfg, cluster, name="policy", executor="local")
        self.teacher = Policy(
            teacher_cfg, cluster, optimizer=False, name="teacher", executor="local"
        )
        self.generation = VllmGeneration(
            student_cfg.generation, student_dir, None, device_type=args.device,
            executor="local", share_student=True,
        )  # fmt: skip
        self.generation.share_module(self.student.local_module())
        self.loss_fn = DistillationLossFn(params=TopkKLParams(kl_type="reverse"))
        vocab = SHAPES[args.student]["vocab_size"]
        gen = torch.Generator().manual_seed(7)
        self.prompts = torch.randint(1, vocab, (args.rows, args.prompt_len), generator=gen).tolist()

    def step(self, step: int) -> dict:
        """One lockstep step: refit, generation, the teacher's top-k, training; seconds and
        peak memory of each phase."""
        from nemo_opd.generation.interface import IN_PLACE

        record = {}
        with self._phase(record, "refit"):
            self.generation.refit(IN_PLACE, step)
        with self._phase(record, "generation"):
            self.generation.prepare_for_generation()
            out = self.generation.generate(self.prompts, seed=step)
            self.generation.finish_generation()
        batch = rollout_batch(self.prompts, out.token_ids)
        record["generated_tokens"] = sum(len(ids) for ids in out.token_ids)
        record["tokens"] = int(batch["input_lengths"].sum())
        with self._phase(record, "teacher"):
            values, indices = self.teacher.get_topk_logits(batch, self.args.k)
        batch["teacher_topk_logprobs"], batch["teacher_topk_indices"] = values, indices
        with self._phase(record, "training"):
            metrics = self.student.train(batch, self.loss_fn)
        record["loss_finite"] = all(map(_finite, metrics["loss"]))
        record["step_s"] = sum(
            record[f"{p}_s"] for p in ("refit", "generation", "teacher", "training")
        )
        print(f"step {step}: {json.dumps(record)}", flush=True)
        return record

    @contextmanager
    def _phase(self, record: dict, name: str):
        """Time the block (device synchronized) and its peak device memory into record."""
        cuda = self.device.type == "cuda"
        if cuda:
            torch.cuda.reset_peak_memory_stats(self.device)
        sync(self.device)
        started = time.perf_counter()
        yield
        sync(self.device)
        record[f"{name}_s"] = time.perf_counter() - started
        if cuda:
            record[f"{name}_peak_gib"] = torch.cuda.max_memory_allocated(self.device) / 2**30

    def shutdown(self) -> None:
        for part in (self.generation, self.teacher, self.student):
            part.shutdown()


def rollout_batch(prompts: list[list[int]], generated: list[list[int]]) -> dict:
    """The loop's batch of prompt + response rows (right-padded), the response tokens trained."""
    lengths = [len(p) + len(g) for p, g in zip(prompts, generated, strict=True)]
    width = max(lengths)
    ids = torch.zeros(len(prompts), width, dtype=torch.long)
    mask = torch.zeros(len(prompts), width)
    for row, (prompt, response) in enumerate(zip(prompts, generated, strict=True)):
        ids[row, : lengths[row]] = torch.tensor(prompt + response)
        mask[row, len(prompt) : lengths[row]] = 1.0
    return {
        "input_ids": ids,
        "input_lengths": torch.tensor(lengths),
        "token_mask": mask,
        "sample_mask": torch.ones(len(prompts)),
    }


def _finite(value: float) -> bool:
    return value == value and abs(value) != float("inf")


def _timed(device, call) -> tuple[float, object]:
    sync(device)
    started = time.perf_counter()
    result = call()
    sync(device)
    return time.perf_counter() - started, result


def _shapes_record(args, steps: list[dict], saved_s: float, built_s: float, gather_s) -> dict:
    mean = {key: statistics.mean(s[key] for s in steps) for key in steps[0] if key != "loss_finite"}
    cuda = args.device == "cuda"
    return {
        "device": torch.cuda.get_device_name() if cuda else "cpu",
        "student": args.student, "teacher": args.teacher, "precision": args.precision,
        "rows": args.rows, "prompt_len": args.prompt_len, "new_tokens": args.new_tokens,
        "k": args.k, "steps": len(steps), "save_s": round(saved_s, 1), "build_s": round(built_s, 1),
        "mean": {key: round(value, 4) for key, value in mean.items()},
        "generation_tokens_per_s": mean["generated_tokens"] / mean["generation_s"],
        "teacher_tokens_per_s": mean["tokens"] / mean["teacher_s"],
        "training_tokens_per_s": mean["tokens"] / mean["training_s"],
        "step_tokens_per_s": mean["tokens"] / mean["step_s"],
        "engine_alone_tokens_per_s": ENGINE_ALONE_TOKENS_PER_S,
        "peak_gib": torch.cuda.max_memory_reserved() / 2**30 if cuda else None,
        "copy_refit_gather_s": gather_s,
    }  # fmt: skip


def _shapes_table(record: dict) -> str:
    """The lane's table of the shapes run."""
    mean = record["mean"]
    peak = record["device"] != "cpu"
    lines = [
        f"{record['student']} from {record['teacher']} on {record['device']}, "
        f"{record['precision']}: {record['rows']} rollouts of {record['prompt_len']} + at most "
        f"{record['new_tokens']} tokens, top-{record['k']}, mean of {record['steps']} steps; "
        f"models saved in {record['save_s']} s, loaded in {record['build_s']} s",
        "| phase | seconds | tokens/s | peak GiB |",
        "| --- | --- | --- | --- |",
    ]
    rates = {
        "generation": record["generation_tokens_per_s"],
        "teacher": record["teacher_tokens_per_s"],
        "training": record["training_tokens_per_s"],
    }
    for phase in ("refit", "generation", "teacher", "training"):
        rate = f"{rates[phase]:,.0f}" if phase in rates else "-"
        memory = f"{mean[f'{phase}_peak_gib']:.1f}" if peak else "-"
        lines.append(f"| {phase} | {mean[f'{phase}_s']:.3f} | {rate} | {memory} |")
    lines.append(f"| step | {mean['step_s']:.3f} | {record['step_tokens_per_s']:,.0f} | - |")
    alone = record["engine_alone_tokens_per_s"]
    lines.append(
        f"training {record['training_tokens_per_s']:,.0f} tokens/s against the engine alone's "
        f"{alone:,} (no activation checkpointing): {record['training_tokens_per_s'] / alone:.2f}x"
    )
    if record["peak_gib"] is not None:
        lines.append(f"peak reserved GPU memory over the run: {record['peak_gib']:.1f} GiB")
    if record["copy_refit_gather_s"] is not None:
        lines.append(
            f"refit reading the student's module: {mean['refit_s']:.4f} s; a copying refit's "
            f"gather of the weights alone: {record['copy_refit_gather_s']:.2f} s"
        )
    return "\n".join(lines)


def _write_json(path: str | None, record: dict) -> None:
    if path:
        Path(path).write_text(json.dumps(record, indent=2, default=str) + "\n")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="mode", required=True)
    a = sub.add_parser("tiny")
    a.add_argument("--device", default="cuda")
    a.add_argument("--steps", type=int, default=None, help="default: the config's")
    a.add_argument("--val-samples", type=int, default=None, help="default: the config's")
    a.add_argument("--reference-accuracy", type=float, default=None)
    a.add_argument("--tolerance", type=float, default=0.02)
    a.add_argument("--deadline-s", type=float, default=600.0)
    a.add_argument("--run-dir", default=None)
    a.add_argument("--json", default=None)
    b = sub.add_parser("shapes")
    b.add_argument("--device", default="cuda")
    b.add_argument("--student", default="qwen3-1.7b-base", choices=list(SHAPES))
    b.add_argument("--teacher", default="qwen3-8b", choices=list(SHAPES))
    b.add_argument("--precision", default="bfloat16")
    b.add_argument("--rows", type=int, default=64)
    b.add_argument("--prompt-len", type=int, default=256)
    b.add_argument("--new-tokens", type=int, default=512)
    b.add_argument("--max-batch-tokens", type=int, default=131072)
    b.add_argument("--k", type=int, default=64)
    b.add_argument("--warmup", type=int, default=1)
    b.add_argument("--steps", type=int, default=2)
    b.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    b.add_argument("--copy-refit", action="store_true", help="also time a copying refit's gather")
    b.add_argument("--tmp", default=None, help="where the random models are saved")
    b.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    return tiny(args) if args.mode == "tiny" else shapes(args)


if __name__ == "__main__":
    sys.exit(main())
