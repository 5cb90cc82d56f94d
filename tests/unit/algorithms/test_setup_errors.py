"""Bad inputs stop the run at setup with one clear message (exit status 2): wrong tokenizer
pairs and model configs before any worker starts; missing or malformed datasets and prompts that
are all too long before any training worker starts (the vLLM engine already loading is
stopped). The message goes to stderr, as configuration errors do."""

import json
import shutil
from pathlib import Path

import pytest

from nemo_opd.cli import main
from nemo_opd.tiny.assets import ensure_tiny_assets
from nemo_opd.tiny.recipe import micro_recipe
from nemo_opd.tiny.task import TinyMathConfig, build_tiny_math_splits
from nemo_opd.tiny.tokenizer import build_tiny_tokenizer

CONFIG = "examples/configs/distillation_tiny.yaml"


@pytest.fixture(scope="module")
def assets():
    return ensure_tiny_assets(micro_recipe())


# One Ray for the module (tests/conftest.py's ray_session): the command line attaches to it
# instead of starting and stopping its own for every refused run.
pytestmark = pytest.mark.usefixtures("ray_session")


def run(assets, tmp_path, *overrides):
    return main(
        [
            "--config",
            CONFIG,
            f"policy.model_name={assets.student}",
            f"policy.tokenizer.name={assets.tokenizer}",
            f"teacher.model_name={assets.teacher}",
            f"teacher.tokenizer.name={assets.tokenizer}",
            f"logger.log_dir={tmp_path / 'logs'}",
            f"checkpointing.checkpoint_dir={tmp_path / 'ckpt'}",
            *overrides,
        ]
    )


def test_a_teacher_tokenizer_its_model_cannot_read(assets, tmp_path, capsys):
    # Another tokenizer is a teacher with another tokenizer (cross-tokenizer scoring), but it
    # must fit the teacher model's own vocabulary.
    records = build_tiny_math_splits(TinyMathConfig(num_train=300, num_validation=5, seed=9))
    other = build_tiny_tokenizer(records["train"], 700, 2, 128)  # more ids than the model
    other.save_pretrained(tmp_path / "other")
    assert run(assets, tmp_path, f"teacher.tokenizer.name={tmp_path / 'other'}") == 2
    captured = capsys.readouterr()
    assert "its vocabulary differs from the student's" in captured.out
    assert "does not fit the vocabulary of teacher.model_name" in captured.err


def test_missing_dataset_path(assets, tmp_path, capsys):
    missing = tmp_path / "missing.jsonl"
    assert run(assets, tmp_path, "data.dataset_name=null", f"data.train_path={missing}") == 2
    assert f"data.train_path: file not found: {missing}" in capsys.readouterr().err


def test_dataset_without_the_columns(assets, tmp_path, capsys):
    path = tmp_path / "train.jsonl"
    path.write_text(json.dumps({"question": "1 + 1", "solution": "2"}) + "\n")
    code = run(
        assets,
        tmp_path,
        "data.dataset_name=null",
        f"data.train_path={path}",
        f"data.val_path={path}",
    )
    assert code == 2
    out = capsys.readouterr().err
    assert "no column 'prompt' (data.prompt_key); columns: question, solution" in out


def test_empty_dataset(assets, tmp_path, capsys):
    path = tmp_path / "empty.jsonl"
    path.write_text("")
    assert run(assets, tmp_path, "data.dataset_name=null", f"data.train_path={path}") == 2
    assert "has no rows" in capsys.readouterr().err


def test_all_prompts_too_long(assets, tmp_path, capsys):
    micro_data = (  # the micro build's 400 problems: the message, not 50,000 prompts' rendering
        "data.dataset_name=null",
        f"data.train_path={assets.train_file}",
        f"data.val_path={assets.validation_file}",
    )
    assert run(assets, tmp_path, *micro_data, "data.max_input_seq_length=4") == 2
    rows = len(Path(assets.train_file).read_text().splitlines())
    assert f"all {rows} prompts are longer than 4 tokens" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("section", "kept"),
    [("policy", None), ("teacher", None), ("policy", "model.safetensors.index.json")],
)
def test_a_model_directory_without_weights(assets, tmp_path, capsys, section, kept):
    # It passed setup and failed later in the workers (exit status 1, a worker traceback). A
    # sharded checkpoint's index without its shards has no weights either.
    source = Path(assets.student if section == "policy" else assets.teacher)
    model = tmp_path / "model"
    shutil.copytree(source, model, ignore=shutil.ignore_patterns("*.safetensors"))
    if kept is not None:
        index = {
            "metadata": {},
            "weight_map": {"lm_head.weight": "model-00001-of-00002.safetensors"},
        }
        (model / kept).write_text(json.dumps(index))
    assert run(assets, tmp_path, f"{section}.model_name={model}") == 2
    err = capsys.readouterr().err
    missing = "lacks model-00001-of-00002.safetensors, which" if kept else "has no weights"
    assert f"error: {section}.model_name: {model} {missing}" in err


@pytest.mark.parametrize("case", ["unknown_family", "logit_step"])
def test_a_model_whose_output_head_is_not_known(assets, tmp_path, capsys, case):
    # A teacher of a family nemo_opd does not reproduce (GPT-2), or a Qwen3 config carrying a
    # logit scale its family's head ignores: refused by name before any worker starts.
    import torch
    from transformers import AutoConfig, GPT2Config, GPT2LMHeadModel

    model = tmp_path / "model"
    if case == "unknown_family":
        vocab = AutoConfig.from_pretrained(assets.teacher).vocab_size
        config = GPT2Config(vocab_size=vocab, n_embd=32, n_layer=1, n_head=2, n_positions=512)
        GPT2LMHeadModel(config).to(torch.float32).save_pretrained(model)
        refused = "error: teacher.model_name: model_type 'gpt2': its output head"
    else:
        shutil.copytree(assets.teacher, model)
        config = json.loads((model / "config.json").read_text())
        (model / "config.json").write_text(json.dumps({**config, "logits_scaling": 8.0}))
        refused = "error: teacher.model_name: model_type 'qwen3' sets logits_scaling=8.0"
    assert run(assets, tmp_path, f"teacher.model_name={model}") == 2
    assert refused in capsys.readouterr().err


def test_topk_larger_than_vocabulary(assets, tmp_path, capsys):
    assert run(assets, tmp_path, "distillation.topk_logits_k=100000") == 2
    assert "distillation.topk_logits_k (100000) exceeds the vocabulary size" in (
        capsys.readouterr().err
    )


def test_tensor_parallel_must_divide_heads(assets, tmp_path, capsys):
    assert (
        run(
            assets, tmp_path, "policy.dtensor_cfg.tensor_parallel_size=4", "cluster.gpus_per_node=4"
        )
        == 2
    )
    out = capsys.readouterr().err
    assert "policy: tensor_parallel_size 4 must divide the model's num_attention_heads (2)" in out


def test_megatron_student_on_cpu_must_train_in_fp32():
    from pathlib import Path

    from nemo_opd.algorithms.model_checks import check_megatron_training_precision
    from nemo_opd.config import load_config
    from nemo_opd.errors import SetupError

    config = Path(__file__).parents[3] / "examples/configs/distillation_tiny_megatron.yaml"
    bf16 = load_config(config, ["policy.precision=bfloat16", "teacher.precision=bfloat16"])
    refused = r"policy\.precision=bfloat16 .* policy\.precision=float32"
    with pytest.raises(SetupError, match=refused):
        check_megatron_training_precision(bf16.policy, "cpu")
    check_megatron_training_precision(bf16.policy, "cuda")  # autocast training works on GPU
    check_megatron_training_precision(load_config(config).policy, "cpu")  # fp32
    dtensor = load_config(config.with_name("distillation_tiny.yaml"), ["policy.precision=bfloat16"])
    check_megatron_training_precision(dtensor.policy, "cpu")  # DTensor's autocast trains on CPU


SAID_AT_START = {
    "ray": (
        "device: cpu (cluster.device is auto and Ray sees no GPU: every worker and vLLM run on "
        "the CPU; set cluster.device=cuda to require GPUs)",
        "workers: 1 training worker (each runs a rank of the student and of the teacher) on 1 "
        "node, 1 {engine} engine (sharing the training workers' CPUs); where Ray placed each is "
        "printed once they have started",
    ),
    "local": (
        "device: cpu (cluster.device is auto and this process sees no GPU: every worker and "
        "vLLM run on the CPU; set cluster.device=cuda to require GPUs)",
        "workers: one process (cluster.executor local, no Ray): the student, the teacher, 1 "
        "{engine} engine on 2 threads",  # the config's cluster.cpus_per_worker, in lockstep
    ),
}


@pytest.mark.parametrize("executor", list(SAID_AT_START))
@pytest.mark.parametrize(
    ("backend", "engine"), [("vllm", "vLLM"), ("transformers", "transformers")]
)
def test_the_device_and_the_workers_are_said_at_start(
    assets, tmp_path, capsys, executor, backend, engine
):
    # cluster.device auto fell back to CPU without a word. A Megatron student in bf16 on CPU
    # is refused right after the device is known: the lines come before anything starts.
    if backend == "vllm":
        pytest.importorskip("vllm")
    config = Path(__file__).parents[3] / "examples/configs/distillation_tiny_megatron.yaml"
    code = main(
        [
            "--config",
            str(config),
            "cluster.device=auto",
            f"cluster.executor={executor}",
            "policy.precision=bfloat16",
            f"policy.generation.backend={backend}",
            f"logger.log_dir={tmp_path / 'logs'}",
            f"checkpointing.checkpoint_dir={tmp_path / 'ckpt'}",
        ]
    )
    assert code == 2
    out = capsys.readouterr().out
    assert max(len(line) for line in out.splitlines()) <= 80  # wrapped at the console's width
    for line in SAID_AT_START[executor]:
        assert line.format(engine=engine) in " ".join(out.split())


def _data_files(tmp_path, train_lines, val_rows=5):
    """A train JSONL file with these lines and a valid validation file."""
    train, val = tmp_path / "train.jsonl", tmp_path / "val.jsonl"
    train.write_text("".join(line + "\n" for line in train_lines))
    row = {"prompt": "What is 1 + 1?", "answer": "2"}
    val.write_text((json.dumps(row) + "\n") * val_rows)
    return ("data.dataset_name=null", f"data.train_path={train}", f"data.val_path={val}")


GOOD_ROW = json.dumps({"prompt": "What is 2 + 3?", "answer": 5})


@pytest.mark.parametrize("row", ["[1, 2, 3]", "NaN", '"What is 2 + 3?"', "5"])
def test_row_that_is_not_an_object(assets, tmp_path, capsys, row):
    assert run(assets, tmp_path, *_data_files(tmp_path, [GOOD_ROW, row])) == 2
    err = capsys.readouterr().err
    assert f"error: data.train_path ({tmp_path / 'train.jsonl'}): line 2 is " in err
    assert ", not an object: every row must be an object holding the fields 'prompt'" in err


def test_malformed_line_is_named_by_its_line_in_the_file(assets, tmp_path, capsys):
    lines = [GOOD_ROW] * 41 + ['{"prompt": "What is 2 + 3?", "answer": 5']
    assert run(assets, tmp_path, *_data_files(tmp_path, lines)) == 2
    assert "line 42 is not valid JSON (Expecting ',' delimiter at column 41)" in (
        capsys.readouterr().err
    )


@pytest.mark.parametrize(
    ("row", "refusal"),
    [
        ({"prompt": None, "answer": 5}, "line 2: 'prompt' (data.prompt_key) is null"),
        (
            {"prompt": "What is 2 + 3?", "answer": None},
            "line 2: 'answer' (data.answer_key) is null",
        ),
        (
            {"prompt": "What is 2 + 3?", "answer": [5]},
            "line 2: 'answer' (data.answer_key) is a list",
        ),
        ({"prompt": "What is 2 + 3?"}, "line 2 has no column 'answer' (data.answer_key)"),
    ],
)
def test_null_missing_or_list_field(assets, tmp_path, capsys, row, refusal):
    assert run(assets, tmp_path, *_data_files(tmp_path, [GOOD_ROW, json.dumps(row)])) == 2
    err = capsys.readouterr().err
    assert f"error: data.train_path ({tmp_path / 'train.jsonl'}): {refusal}" in err


def test_prompt_file_that_is_not_utf8(assets, tmp_path, capsys):
    prompt = tmp_path / "prompt.txt"
    prompt.write_bytes("Résous : {}\n".encode("latin-1"))
    assert run(assets, tmp_path, f"data.prompt_file={prompt}") == 2
    assert f"error: data.prompt_file: could not read {prompt}: line 1 is not UTF-8 text" in (
        capsys.readouterr().err
    )


def test_fewer_prompts_than_one_batch(assets, tmp_path, capsys):
    long_prompt = json.dumps({"prompt": "What is 2 + 3? " * 20, "answer": 5})
    lines = [GOOD_ROW] * 30 + [long_prompt] * 2  # rows enough for the pre-flight's count
    overrides = _data_files(tmp_path, lines)
    assert run(assets, tmp_path, *overrides, "data.max_input_seq_length=40") == 2
    assert (
        "error: distillation.num_prompts_per_step is 32 but there are only 30 usable train "
        "prompts (2 skipped as longer than 40 tokens): lower distillation.num_prompts_per_step "
        "to at most 30, add prompts, or raise data.max_input_seq_length"
    ) in capsys.readouterr().err


def test_tensor_parallel_needs_whole_heads_not_a_divisible_vocabulary():
    from transformers import Qwen3Config

    from nemo_opd.algorithms.model_checks import check_tensor_parallel
    from nemo_opd.config import PolicyConfig
    from nemo_opd.errors import SetupError

    model = Qwen3Config(vocab_size=481, num_attention_heads=4, num_key_value_heads=2)

    def policy(tp: int) -> PolicyConfig:
        raw = {"model_name": "m", "tokenizer": {"name": "m"}, "max_total_sequence_length": 8}
        return PolicyConfig.model_validate({**raw, "dtensor_cfg": {"tensor_parallel_size": tp}})

    check_tensor_parallel(policy(2), model, "policy")  # 481 rows: padded by the engines
    refused = (
        r"policy: tensor_parallel_size 4 must divide the model's num_key_value_heads \(2\); .*"
        r"must divide both \(4 and 2\); the vocabulary need not divide"
    )
    with pytest.raises(SetupError, match=refused):
        check_tensor_parallel(policy(4), model, "policy")


@pytest.mark.parametrize("colocated", [True, False])
def test_seq_kd_on_gpus_is_refused_before_anything_waits(colocated):
    """The teacher's vLLM engine has no device of its own on CUDA: refused at once, where it
    used to wait for a GPU forever (non-colocated) with no time-out."""
    from nemo_opd.algorithms.setup_generation import build_teacher_sampler
    from nemo_opd.config import load_config
    from nemo_opd.config.worker_split import worker_split
    from nemo_opd.errors import SetupError

    overrides = [
        "distillation.seq_kd=true",
        "distillation.lmbda=0",
        f"policy.generation.colocated.enabled={str(colocated).lower()}",
        "cluster.gpus_per_node=2",
    ]
    if not colocated:
        overrides += [
            "policy.generation.colocated.resources.gpus_per_node=1",
            "policy.generation.colocated.resources.num_nodes=1",
        ]
    cfg = load_config(CONFIG, overrides)
    split = worker_split(cfg.cluster, cfg.policy.generation)
    with pytest.raises(SetupError, match="no devices to place it on"):
        build_teacher_sampler(cfg, "cuda", split, placement=None)


@pytest.mark.parametrize("executor", ["local", "processes"])
def test_more_workers_on_cuda_than_the_machine_has_gpus_is_refused_at_once(
    assets, tmp_path, capsys, executor
):
    """Without Ray, worker r takes this machine's r-th visible GPU: a config that asks for more
    than it has is refused before any worker starts (it ended in each worker's CUDA error)."""
    import torch

    workers, visible = (1 if executor == "local" else 2), torch.cuda.device_count()
    if visible >= workers:
        pytest.skip(f"this machine has {workers} GPU(s) for the config")
    code = run(
        assets,
        tmp_path,
        "cluster.device=cuda",
        f"cluster.executor={executor}",
        f"cluster.gpus_per_node={workers}",
        "distillation.max_staleness=0",  # colocated on GPUs: lockstep
    )
    assert code == 2
    err = capsys.readouterr().err
    assert f"error: {workers} worker(s) on cuda, and cluster.executor {executor} gives" in err
    assert f"makes visible, but it has {visible}; lower cluster.gpus_per_node" in err
    assert "Traceback" not in err
