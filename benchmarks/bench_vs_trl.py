"""The embedded default beside TRL's two on-policy distillation trainers: held-out accuracy
against wall time.

    uv run --extra cpu --group bench python benchmarks/bench_vs_trl.py --out runs/bench_vs_trl

One after the other on this machine, each as a fresh Python process timed from launch to exit:

1. TRL (`trl==1.16`, the `bench` dependency group), GKDTrainer and then DistillationTrainer
   (TRL's newer trainer: always on-policy, the LM heads in chunks), each training the config's
   student from its teacher at matched settings read from the same config: all on-policy
   (GKD's lmbda 1), the forward KL as beta 0 (the reverse KL as beta 1, the jsd as jsd_beta),
   one optimizer step per policy.train_global_batch_size rollouts and the same total number of
   rollouts, the same learning rate, cosine schedule and floor, warmup, weight decay, betas,
   gradient clipping, max new tokens, sampling temperature and seed. Set up for speed as its
   expert users would (`speed_args`: gradient checkpointing off, so generation keeps its KV
   cache; fp32; no checkpoints or trackers). HF generate samples the rollouts; torch uses every
   core. Like the loop, it validates where the config does (greedy over the same held-out
   problems, nemo_opd.tiny.evaluation; --no-trl-validation skips it), and it saves the student
   halfway and at the end.
2. nemo_opd: the README's command, examples/run_distillation_math.py --config CONFIG, with its
   checkpoints and logs under --out.

Then, untimed, every saved student of all of them (and the initial one) is scored by one
evaluator: greedy HF generate over all held-out problems, exact match of the last boxed answer
(nemo_opd.tiny.evaluation). nemo_opd's own validation accuracies (the math environment's
verifier, the run's generation engine decoding greedily) are reported beside them. The
accuracy of a saved student is placed at the wall time (since its process started) at which
it was saved.

Writes OUT/results.json, OUT/results.md (the table) and OUT/accuracy_vs_time.png, and prints
the table and the verdict of the check: nemo_opd's whole command no slower than TRL's fastest
whole process, to that process's final accuracy within one point.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "benchmarks"))

from harness import fresh_run_dir, loop_command, pyplot, run_meta, save_figure  # noqa: E402

ACCURACY_SLACK = 0.01
"""nemo_opd's final accuracy may be this much below TRL's and still count as reaching it."""


# ------------------------------------------------------------------------------------ settings


def matched_settings(config: str, overrides: list[str]) -> dict:
    """GKDTrainer's settings matched to a nemo_opd config (see the module docstring)."""
    from nemo_opd.config import load_config
    from nemo_opd.tiny import resolve_pretrained

    cfg = load_config(config, overrides)
    loop, policy = cfg.distillation, cfg.policy
    if cfg.objective.loss != "topk_kl" or cfg.loss_fn.kl_type == "mixed":
        raise SystemExit(
            "bench_vs_trl matches the top-k objectives TRL has (forward, reverse, jsd) only"
        )
    if cfg.teacher is None:
        raise SystemExit("bench_vs_trl needs a config with a teacher")
    if cfg.data.prompt_file or cfg.data.system_prompt_file:
        raise SystemExit(
            "bench_vs_trl gives TRL bare prompts: unset data.prompt_file and "
            "data.system_prompt_file"
        )
    rollouts = loop.num_prompts_per_step * loop.num_generations_per_prompt * loop.max_num_steps
    batch = policy.train_global_batch_size
    return {
        "config": str(Path(config).resolve()),
        "overrides": list(overrides),
        "student": resolve_pretrained(policy.model_name),
        "teacher": resolve_pretrained(cfg.teacher.model_name),
        "tokenizer": resolve_pretrained(policy.tokenizer.name),
        "beta": {"forward": 0.0, "reverse": 1.0}.get(cfg.loss_fn.kl_type, cfg.loss_fn.jsd_beta),
        "batch_size": batch,
        "max_steps": rollouts // batch,
        "rollouts": rollouts,
        "learning_rate": policy.optimizer.lr,
        "weight_decay": policy.optimizer.weight_decay,
        "adam_beta1": policy.optimizer.betas[0],
        "adam_beta2": policy.optimizer.betas[1],
        "adam_epsilon": policy.optimizer.eps,
        "max_grad_norm": policy.max_grad_norm or 0.0,
        "scheduler": policy.scheduler.name,
        "min_lr_ratio": policy.scheduler.min_lr_ratio,
        "warmup_steps": policy.scheduler.warmup_steps,
        "max_new_tokens": policy.generation.max_new_tokens,
        "temperature": policy.generation.temperature or 1.0,
        "max_length": policy.max_total_sequence_length,
        "seed": loop.seed,
        "validation_steps": validation_steps(cfg, rollouts // batch),
        "max_val_samples": loop.max_val_samples,
        "max_staleness": loop.max_staleness,  # nemo_opd's side only: TRL's rollouts are on-policy
    }


def validation_steps(cfg, max_steps: int) -> list[int]:
    """The optimizer steps after which TRL's process validates: where the config's loop does
    (distillation.val_at_start, val_period, val_at_end), counted in TRL's optimizer steps."""
    loop = cfg.distillation
    per_step = max_steps // loop.max_num_steps  # TRL optimizer steps per loop step
    steps = {0} if loop.val_at_start else set()
    if loop.val_period:
        steps |= set(range(loop.val_period, loop.max_num_steps + 1, loop.val_period))
    if loop.val_at_end:
        steps.add(loop.max_num_steps)
    return sorted(step * per_step for step in steps)


def prompt_records(settings: dict, split: str) -> list[dict]:
    """The config's records of `split` ({"prompt", "answer"}), as the loop reads them."""
    from nemo_opd.config import load_config
    from nemo_opd.data.datasets import load_prompt_records

    return load_prompt_records(load_config(settings["config"], settings["overrides"]).data, split)


def scheduler_args(settings: dict) -> dict:
    """TrainingArguments for the config's schedule."""
    name = settings["scheduler"]
    if name == "cosine":
        return {
            "lr_scheduler_type": "cosine_with_min_lr",
            "lr_scheduler_kwargs": {"min_lr_rate": settings["min_lr_ratio"]},
        }
    if name == "constant":
        return {"lr_scheduler_type": "constant_with_warmup"}
    raise SystemExit(f"bench_vs_trl has no GKDTrainer schedule for scheduler.name={name!r}")


# ------------------------------------------------------------------------------ the TRL process


TRL_TRAINERS = {"gkd": "TRL GKDTrainer", "distillation": "TRL DistillationTrainer"}
"""The peer's two on-policy distillation trainers (bench_vs_trl.py trl --trainer NAME)."""


def speed_args(settings: dict, out: Path) -> dict:
    """TrainingArguments both TRL trainers share: the config's optimisation, and what a
    speed-minded TRL user sets for a 1M-parameter model on CPU (docs/benchmarks.md names each).

    - gradient_checkpointing False: TRL's distillation configs default it to True, and GKDTrainer
      then also generates with use_cache=False (every sampled token re-runs the whole prefix);
      recomputation saves no memory worth having at this size.
    - bf16 False unless settings["bf16"]: fp32 is the CPU's fast path at the tiny size (TRL's
      configs default bf16 to True; bench_vs_trl_wide.py measures both at a real width).
    - no checkpoints, no trackers, no progress bar, no data-loader workers or pinned memory.
    """
    return {
        "output_dir": str(out / "trainer"),
        "per_device_train_batch_size": settings["batch_size"],
        "gradient_accumulation_steps": 1,
        "max_steps": settings["max_steps"],
        "learning_rate": settings["learning_rate"],
        "weight_decay": settings["weight_decay"],
        "adam_beta1": settings["adam_beta1"],
        "adam_beta2": settings["adam_beta2"],
        "adam_epsilon": settings["adam_epsilon"],
        "max_grad_norm": settings["max_grad_norm"],
        "warmup_steps": settings["warmup_steps"],
        **scheduler_args(settings),
        "beta": settings["beta"],
        "temperature": settings["temperature"],
        "seed": settings["seed"],
        "use_cpu": True,
        "bf16": settings.get("bf16", False),
        "gradient_checkpointing": False,
        "logging_steps": max(1, settings["max_steps"] // 20),
        "save_strategy": "no",
        "report_to": [],
        "dataloader_num_workers": 0,
        "dataloader_pin_memory": False,
        "disable_tqdm": True,
    }


def trl_trainer(name: str, settings: dict, out: Path, tokenizer, callbacks: list):
    """The TRL trainer `name` at matched settings (the module docstring), ready to train."""
    from datasets import Dataset

    records = prompt_records(settings, "train")[: settings["rollouts"]]
    common = speed_args(settings, out)
    if name == "gkd":
        from trl.experimental.gkd import GKDConfig, GKDTrainer

        # lmbda=1: every batch is replaced by the student's samples, so the assistant turn (the
        # collator's labels) is never trained on.
        rows = [
            {
                "messages": [
                    {"role": "user", "content": r["prompt"]},
                    {"role": "assistant", "content": r["answer"]},
                ]
            }
            for r in records
        ]
        config = GKDConfig(
            **common,
            lmbda=1.0,
            max_new_tokens=settings["max_new_tokens"],
            max_length=settings["max_length"],
        )
        trainer_class = GKDTrainer
    else:
        from trl import DistillationConfig, DistillationTrainer

        # Always on-policy: it samples one completion per prompt and matches the teacher's whole
        # distribution on it, the LM heads in chunks.
        rows = [{"prompt": [{"role": "user", "content": r["prompt"]}]} for r in records]
        config = DistillationConfig(**common, max_completion_length=settings["max_new_tokens"])
        trainer_class = DistillationTrainer
    return trainer_class(
        model=settings["student"],
        teacher_model=settings["teacher"],
        args=config,
        train_dataset=Dataset.from_list(rows),
        processing_class=tokenizer,
        callbacks=callbacks,
    )


def run_trl(args: argparse.Namespace) -> None:
    """The child process: train with TRL's trainer args.trainer, saving halfway and at the end,
    and write OUT/timeline.json (time.time() of each event; "saves": {step: time})."""
    settings = json.loads(Path(args.settings).read_text())
    out = Path(args.out)
    import torch
    from transformers import AutoTokenizer, TrainerCallback

    from nemo_opd.tiny.evaluation import heldout_accuracy

    timeline = {
        "imports_done": time.time(),
        "threads": torch.get_num_threads(),
        "saves": {},
        "validations": {},
        "validation_s": 0.0,
        "step_ends": [],
        "sampled_tokens": [],
    }
    tokenizer = AutoTokenizer.from_pretrained(settings["tokenizer"])
    count_sampled_tokens(tokenizer.pad_token_id, timeline["sampled_tokens"])
    if args.trainer == "distillation":
        tokenizer.padding_side = "left"  # DistillationTrainer's generation needs it
    half = settings["max_steps"] // 2
    heldout = prompt_records(settings, "validation")[: settings["max_val_samples"]]

    def validate(model, step: int) -> None:
        """What the loop's validation does for the user: greedy on the held-out problems."""
        if step not in settings["validation_steps"] or not args.validate:
            return
        started = time.time()
        accuracy = heldout_accuracy(
            model, tokenizer, heldout, max_new_tokens=settings["max_new_tokens"]
        )
        model.train()
        timeline["validations"][step] = accuracy
        timeline["validation_s"] += time.time() - started

    class SaveAndValidate(TrainerCallback):
        def on_train_begin(self, train_args, state, control, **kwargs):
            validate(kwargs["model"], 0)

        def on_step_end(self, train_args, state, control, **kwargs):
            timeline["step_ends"].append(time.time())
            validate(kwargs["model"], state.global_step)
            if state.global_step == half and args.save:
                kwargs["model"].save_pretrained(out / f"step_{half}")
                timeline["saves"][half] = time.time()

    trainer = trl_trainer(args.trainer, settings, out, tokenizer, [SaveAndValidate()])
    timeline["train_begin"] = time.time()
    trainer.train()
    timeline["train_end"] = time.time()
    if args.save:
        trainer.model.save_pretrained(out / "final")
        tokenizer.save_pretrained(out / "final")
        timeline["saves"][settings["max_steps"]] = time.time()
    (out / "timeline.json").write_text(json.dumps(timeline, indent=2))


def count_sampled_tokens(pad_id: int | None, counts: list[int]) -> None:
    """Append to `counts` the tokens each HF generate call samples (its new ids that are not
    padding): both TRL trainers sample through GenerationMixin.generate(input_ids=...)."""
    import torch
    from transformers import GenerationMixin

    original = GenerationMixin.generate

    def generate(self, *args, **kwargs):
        out = original(self, *args, **kwargs)
        prompt = kwargs.get("input_ids", args[0] if args else None)
        ids = out if isinstance(out, torch.Tensor) else out.sequences
        new = ids[:, prompt.shape[1] :]
        counts.append(int((new != pad_id).sum()) if pad_id is not None else new.numel())
        return out

    GenerationMixin.generate = generate


SYSTEMS = {**{f"trl_{name}": label for name, label in TRL_TRAINERS.items()}, "nemo_opd": "nemo_opd"}
"""Every system the benchmark runs, one after the other, and its label in tables and plots."""

# ------------------------------------------------------------------------------- all, timed


def timed(command: list[str], log: Path) -> tuple[float, float]:
    """Run `command` with its output in `log`; returns (launch time.time(), seconds to exit)."""
    print(f"running: {' '.join(command)}\n  output: {log}", flush=True)
    launched = time.time()
    with open(log, "w") as handle:
        status = subprocess.run(command, stdout=handle, stderr=subprocess.STDOUT, cwd=REPO)
    wall = time.time() - launched
    if status.returncode != 0:
        raise SystemExit(f"{command[1]} failed (exit {status.returncode}); see {log}")
    print(f"  finished in {wall:.1f} s", flush=True)
    return launched, wall


def run_both(args: argparse.Namespace) -> dict:
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    settings = matched_settings(args.config, args.overrides)
    (out / "trl_settings.json").write_text(json.dumps(settings, indent=2))
    results = {"settings": settings, "config": args.config, "overrides": args.overrides}
    for trainer in TRL_TRAINERS:
        system = f"trl_{trainer}"
        if system not in args.systems:
            continue
        trl_out = out / system
        trl_out.mkdir(exist_ok=True)
        command = [
            sys.executable, __file__, "trl", f"--trainer={trainer}",
            "--settings", str(out / "trl_settings.json"), "--out", str(trl_out),
            *([] if args.trl_validation else ["--no-validate"]),
        ]  # fmt: skip
        launched, wall = timed(command, out / f"{system}.log")
        timeline = json.loads((trl_out / "timeline.json").read_text())
        results[system] = {
            "wall_s": wall,
            "imports_s": timeline["imports_done"] - launched,
            "training_s": timeline["train_end"] - timeline["train_begin"],
            "validation_s": timeline["validation_s"],
            "validations": timeline["validations"],
            "threads": timeline["threads"],
            "points": [
                {"step": int(step), "elapsed_s": when - launched, "dir": str(trl_out / name)}
                for step, when in timeline["saves"].items()
                for name in [f"step_{step}" if int(step) < settings["max_steps"] else "final"]
            ],
        }
    if "nemo_opd" in args.systems:
        run_dir = fresh_run_dir(out / "nemo_opd")
        command = loop_command(args.config, run_dir, args.overrides)
        launched, wall = timed(command, out / "nemo_opd.log")
        results["nemo_opd"] = nemo_opd_points(run_dir, wall)
    return results


def nemo_opd_points(run_dir: Path, wall: float) -> dict:
    """Validation steps of the run (time since its process started, its own accuracy) and the
    saved students to score."""
    from nemo_opd.utils.logger import read_jsonl

    records = read_jsonl(run_dir / "logs" / "metrics.jsonl")
    steps = [r for r in records if "validation/accuracy" in r]
    last = max(r["step"] for r in records)
    points = []
    for record in steps:
        step = record["step"]
        saved = run_dir / "checkpoints" / f"step_{step}" / "policy"
        if step == last:
            saved = run_dir / "checkpoints" / "final_model"
        points.append(
            {
                "step": step,
                "elapsed_s": record["progress/elapsed_s"],
                "own_accuracy": record["validation/accuracy"],
                "dir": str(saved) if saved.is_dir() and step > 0 else None,
            }
        )
    first = records[0]
    startup = {k: v for k, v in first.items() if k.startswith("timing/startup/")}
    step_times = [r["timing/train/total_step_time"] for r in records if r["step"] > 0]
    return {
        "wall_s": wall,
        "points": points,
        "startup": startup,
        "mean_step_s": sum(step_times) / max(1, len(step_times)),
    }


# ---------------------------------------------------------------------------- scoring, report


def score(results: dict) -> None:
    """Held-out accuracy of every saved student with one evaluator (untimed)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from nemo_opd.tiny.evaluation import heldout_accuracy

    torch.manual_seed(0)
    settings = results["settings"]
    tokenizer = AutoTokenizer.from_pretrained(settings["tokenizer"])
    heldout = prompt_records(settings, "validation")

    def accuracy(model_dir: str) -> float:
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
        return heldout_accuracy(
            model, tokenizer, heldout, max_new_tokens=settings["max_new_tokens"]
        )

    results["initial_accuracy"] = accuracy(settings["student"])
    for system in SYSTEMS:
        for point in results.get(system, {}).get("points", []):
            point["accuracy"] = accuracy(point["dir"]) if point["dir"] else None


def rollouts_said(settings: dict) -> str:
    """The rollouts each system trained on, and how on-policy nemo_opd's were."""
    staleness = settings.get("max_staleness", 0)
    if not staleness:
        return f"{settings['rollouts']} on-policy rollouts"
    older = "one step" if staleness == 1 else f"up to {staleness} steps"
    return (
        f"{settings['rollouts']} rollouts (TRL's on-policy, nemo_opd's sampled from weights "
        f"{older} older)"
    )


def report(results: dict, out: Path) -> str:
    """The markdown table and verdict; also written to OUT/results.md."""
    initial = results["initial_accuracy"]
    lines = [
        f"Held-out accuracy (greedy HF generate, {rollouts_said(results['settings'])} each; "
        f"initial student {initial:.1%}):",
        "",
        "| system | final accuracy | whole process | gain per minute | accuracy @ seconds since "
        "its start |",
        "|---|---|---|---|---|",
    ]
    finals = {}
    for system, label in SYSTEMS.items():
        if system not in results:
            continue
        data = results[system]
        scored = [p for p in data["points"] if p.get("accuracy") is not None]
        final = scored[-1]["accuracy"] if scored else None
        finals[system] = (final, data["wall_s"])
        curve = ", ".join(f"{p['accuracy']:.1%} @ {p['elapsed_s']:.0f} s" for p in scored)
        shown = f"{final:.1%}" if final is not None else "-"
        rate = f"{(final - initial) * 60 / data['wall_s']:+.1%}" if final is not None else "-"
        lines.append(f"| {label} | {shown} | {data['wall_s']:.1f} s | {rate} | {curve} |")
    if "nemo_opd" in results:
        own = ", ".join(
            f"step {p['step']}: {p['own_accuracy']:.1%}" for p in results["nemo_opd"]["points"]
        )
        lines += ["", f"nemo_opd's own validation (math verifier, greedy): {own}"]
    peers = [system for system in finals if system.startswith("trl_")]
    if "nemo_opd" in finals and peers:
        ours_acc, ours_wall = finals["nemo_opd"]
        best = min(peers, key=lambda system: finals[system][1])  # TRL's fastest whole process
        trl_acc, trl_wall = finals[best]
        reached = ours_acc >= trl_acc - ACCURACY_SLACK
        faster = ours_wall <= trl_wall
        verdict = "met" if reached and faster else "not met"
        lines += [
            "",
            f"check ({verdict}, against TRL's fastest, {SYSTEMS[best]}): nemo_opd "
            f"{ours_wall:.1f} s vs {trl_wall:.1f} s ({ours_wall / trl_wall:.2f}x), final accuracy "
            f"{ours_acc:.1%} vs {trl_acc:.1%} (within {ACCURACY_SLACK:.0%}: "
            f"{'yes' if reached else 'no'})",
        ]
    text = "\n".join(lines)
    (out / "results.md").write_text(text + "\n")
    return text


def plot(results: dict, out: Path) -> Path:
    """Accuracy against seconds since each process started, one line per system."""
    plt = pyplot()
    figure, axes = plt.subplots(figsize=(7, 4.2))
    colors = {"trl_gkd": "tab:orange", "trl_distillation": "tab:green", "nemo_opd": "tab:blue"}
    for system, label in SYSTEMS.items():
        if system not in results:
            continue
        data = results[system]
        points = [(0.0, results["initial_accuracy"])] + [
            (p["elapsed_s"], p["accuracy"]) for p in data["points"] if p.get("accuracy") is not None
        ]
        xs, ys = zip(*points, strict=True)
        exits = f"{label} (exits at {data['wall_s']:.0f} s)"
        axes.plot(xs, ys, marker="o", color=colors[system], label=exits)
        axes.axvline(data["wall_s"], color=colors[system], linestyle=":", linewidth=1)
    axes.set_xlabel("seconds since the process started")
    axes.set_ylabel("held-out accuracy (greedy)")
    axes.set_title(f"{rollouts_said(results['settings'])}, same machine")
    axes.grid(alpha=0.3)
    axes.legend(loc="lower right")
    return save_figure(figure, out / "accuracy_vs_time.png")


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "trl":
        parser = argparse.ArgumentParser(prog="bench_vs_trl.py trl")
        parser.add_argument("--trainer", choices=list(TRL_TRAINERS), required=True)
        parser.add_argument("--settings", required=True)
        parser.add_argument("--out", required=True)
        parser.add_argument("--no-validate", dest="validate", action="store_false")
        parser.add_argument("--no-save", dest="save", action="store_false")
        run_trl(parser.parse_args(sys.argv[2:]))
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="examples/configs/distillation_tiny.yaml")
    parser.add_argument("--out", default="runs/bench_vs_trl")
    parser.add_argument("--systems", nargs="+", default=list(SYSTEMS), choices=list(SYSTEMS))
    parser.add_argument(
        "--no-trl-validation",
        dest="trl_validation",
        action="store_false",
        help="TRL's processes skip the validations the config's loop runs (they run them by "
        "default, greedy over the same held-out problems, so both sides do the same work)",
    )
    parser.add_argument("overrides", nargs="*", help="overrides of the config, for both")
    args = parser.parse_args()
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    results = run_both(args)
    score(results)
    out = Path(args.out).resolve()
    results["meta"] = run_meta()
    (out / "results.json").write_text(json.dumps(results, indent=2))
    print(report(results, out))
    print(f"plot: {plot(results, out)}")


if __name__ == "__main__":
    main()
