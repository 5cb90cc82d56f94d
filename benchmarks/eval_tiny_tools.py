"""Held-out accuracy of tiny tool-task models with the calculator offered and without.

    uv run --extra cpu python benchmarks/eval_tiny_tools.py --sweep runs/tiny_tools
    uv run --extra cpu python benchmarks/eval_tiny_tools.py --models tiny:tools_student DIR ...

Each model (a directory, a "tiny:" name, or with --sweep every finished run's final model,
OUT/runs/<name>/checkpoints/final_model) answers the 500 held-out problems greedily through
the rollout loop and the tool environment (nemo_opd.tiny.tool_task.tool_accuracy: calls run in
a tool worker process): its accuracy with the calculator offered and without, the share of
problems on which it called it, and the share of its calls that failed (malformed, bad
arguments, ...). With --sweep, the runs' wall time and grid point come from OUT/runs.jsonl
(benchmarks/sweep.py), and the table ends with the mean (min-max) over seeds per grid point.
Writes OUT/tools_eval.jsonl (--out, default the sweep's directory).
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import torch

COLUMNS = ("with_tools", "without_tools", "tool_call_rate", "tool_error_rate")


def evaluate(model_dir: str) -> dict[str, float]:
    """The four measures of one model (module docstring)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from nemo_opd.tiny.assets import ensure_tiny_assets, resolve_pretrained
    from nemo_opd.tiny.recipe import tools_recipe
    from nemo_opd.tiny.task import load_jsonl
    from nemo_opd.tiny.tool_task import tool_accuracy

    recipe = tools_recipe()
    assets = ensure_tiny_assets(recipe)
    tokenizer = AutoTokenizer.from_pretrained(assets.tokenizer)
    model = AutoModelForCausalLM.from_pretrained(resolve_pretrained(model_dir), dtype=torch.float32)
    records = load_jsonl(assets.validation_file)
    with_tools = tool_accuracy(model, tokenizer, records, recipe, with_tools=True)
    without = tool_accuracy(model, tokenizer, records, recipe, with_tools=False)
    return {
        "with_tools": with_tools["accuracy"],
        "without_tools": without["accuracy"],
        "tool_call_rate": with_tools["tool_call_rate"],
        "tool_error_rate": with_tools["tool_error_rate"],
    }


def sweep_models(out: Path) -> list[dict]:
    """{"model", "label", "seed", "wall_s"} of every finished run of a sweep."""
    rows = []
    for line in (out / "runs.jsonl").read_text().splitlines():
        record = json.loads(line)
        final = out / "runs" / record["name"] / "checkpoints" / "final_model"
        if record["status"] == 0 and final.is_dir():
            label = " ".join(record["overrides"]) or Path(record["config"]).stem
            wall = round(record["wall_s"], 1)
            rows.append(
                {"model": str(final), "label": label, "seed": record["seed"], "wall_s": wall}
            )
    return rows


def table(rows: list[dict]) -> str:
    """The rows, then per label the mean (min-max) over its rows."""
    header = "| model | seed | with tools | without | call rate | failed calls | wall s |"
    lines = [header, "|" + "---|" * 7]
    for row in rows:
        cells = [f"{row[c]:.1%}" for c in COLUMNS]
        wall = row.get("wall_s", "")
        lines.append(f"| {row['label']} | {row.get('seed', '')} | {' | '.join(cells)} | {wall} |")
    for label in dict.fromkeys(row["label"] for row in rows):
        group = [row for row in rows if row["label"] == label]
        if len(group) < 2:
            continue
        cells = []
        for column in COLUMNS:
            values = [row[column] for row in group]
            cells.append(f"{statistics.mean(values):.1%} ({min(values):.1%}-{max(values):.1%})")
        walls = [row["wall_s"] for row in group if "wall_s" in row]
        wall = f"{statistics.mean(walls):.0f}" if walls else ""
        lines.append(f"| **{label}, mean** | {len(group)} | {' | '.join(cells)} | {wall} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sweep", help="a benchmarks/sweep.py output directory")
    parser.add_argument("--models", nargs="*", default=[], help="model directories or tiny: names")
    parser.add_argument("--out", help="where tools_eval.jsonl goes (default: --sweep)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default: 1)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    rows = [{"model": m, "label": m} for m in args.models]
    if args.sweep:
        rows += sweep_models(Path(args.sweep))
    out = Path(args.out or args.sweep or ".")
    out.mkdir(parents=True, exist_ok=True)
    for row in rows:
        row.update(evaluate(row["model"]))
        with open(out / "tools_eval.jsonl", "a") as handle:
            handle.write(json.dumps(row) + "\n")
        print(json.dumps(row), flush=True)
    print(table(rows))


if __name__ == "__main__":
    main()
