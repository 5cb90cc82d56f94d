"""The loop with its teacher served by vLLM's OpenAI-compatible server: one server for the
module, started by `python -m nemo_opd.teacher_server` with the example config, and the loop
runs in this process (sharing imports and Ray). The straight run's workers are Ray's (auto's
choice for a served teacher); the other runs put them in this process (cluster.executor=local:
a served teacher needs no Ray, and the executors log the same metrics, test_executors_tiny.py).

- the first step's loss equals the in-process teacher's (the served run overlapping: max_staleness
  1, each step scored in two parts while the rest generates);
- each setup check against the live server, triggered for real;
- ServedTeacher itself against the live server: top-k and sampled-token log-probs against the
  teacher's Hugging Face forward in fp32 and the in-process teacher, ragged rows, many requests
  in flight, a top-k the server refuses;
- the server killed mid-run, rollouts in flight: the run ends with one message after
  checkpointing its last completed step (with the rollouts made ahead of it), and once the
  server is restarted the same command resumes and ends with the uninterrupted run's metrics.
"""

import contextlib
import io
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch
from run_metrics import assert_resumed_like, read_metrics
from served_rows import ragged_batch
from transformers import AutoModelForCausalLM

from nemo_opd.cli import EXIT_CONFIG_ERROR, EXIT_RUN_FAILED, main
from nemo_opd.teachers.served import ServedTeacher, ServedTeacherError
from nemo_opd.tiny.assets import resolve_pretrained
from nemo_opd.tiny.task import TinyMathConfig, build_tiny_math_splits
from nemo_opd.tiny.tokenizer import build_tiny_tokenizer

ROOT = Path(__file__).resolve().parents[2]
SERVED = ROOT / "examples" / "configs" / "distillation_tiny_served_teacher.yaml"
TINY = ROOT / "examples" / "configs" / "distillation_tiny.yaml"
K = 16
STEPS = 3
OVERLAP = ("distillation.max_staleness=1", "distillation.stream_chunks=2")
"""The straight run and the killed one overlap: rollouts one step ahead, scored in two parts
while generating (the first step is still the initial weights' own, as in-process)."""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class TeacherServer:
    """`python -m nemo_opd.teacher_server` for the example config on a fixed port, in its own
    process group (the command and vLLM's processes below it)."""

    def __init__(self) -> None:
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}/v1"
        self.process = None

    def start(self, attempts: int = 3) -> None:
        """Start the server; a start that ends before it is ready is tried again on a new
        port (another process of the machine may bind the free port before the server does,
        seconds later), up to `attempts` times."""
        for _ in range(attempts):
            self.process = subprocess.Popen(
                [sys.executable, "-m", "nemo_opd.teacher_server", "--config", str(SERVED)]
                + ["--port", str(self.port)],
                cwd=ROOT,
                stdout=subprocess.PIPE,
                text=True,
                start_new_session=True,
            )
            if any(line.startswith("teacher server ready") for line in self.process.stdout):
                return
            self.process.wait(60)
            self.port = free_port()
            self.base_url = f"http://127.0.0.1:{self.port}/v1"
        pytest.fail(f"the teacher server did not start (status {self.process.poll()})")

    def kill(self) -> None:
        """SIGKILL to every process of the server: no clean shutdown."""
        os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(60)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            self.process.wait(60)


@pytest.fixture(scope="module")
def server(ray_session):
    server = TeacherServer()
    server.start()
    yield server
    server.stop()


def run_loop(run_dir: Path, *extra: str, steps: int = 1) -> int:
    return main(
        [
            "--config",
            str(SERVED),
            f"distillation.max_num_steps={steps}",
            "distillation.num_prompts_per_step=8",
            "distillation.val_at_start=false",
            "distillation.val_period=0",
            "distillation.val_at_end=false",
            "distillation.max_val_samples=16",
            "distillation.val_batch_size=16",
            "policy.train_global_batch_size=16",
            "policy.train_micro_batch_size=8",
            "policy.generation.max_new_tokens=12",
            "checkpointing.save_period=100",  # only the last step, and a fault's
            "checkpointing.metric_name=null",
            f"checkpointing.checkpoint_dir={run_dir / 'checkpoints'}",
            f"logger.log_dir={run_dir / 'logs'}",
            "logger.console_progress=false",
            *extra,
        ]
    )


@pytest.fixture(scope="module")
def straight(server, tmp_path_factory):
    """The uninterrupted served run: its directory, metrics by step and stdout."""
    run_dir = tmp_path_factory.mktemp("straight")
    url = f"teacher.server.base_url={server.base_url}"
    with contextlib.redirect_stdout(io.StringIO()) as out:
        assert run_loop(run_dir, url, "distillation.val_at_end=true", *OVERLAP, steps=STEPS) == 0
    return run_dir, read_metrics(run_dir), out.getvalue()


def test_auto_runs_a_served_teachers_workers_on_ray(straight):
    out = " ".join(straight[2].split())  # the console wraps its lines
    assert "workers: 1 training worker" in out
    assert "where Ray placed each is printed once they have started" in out


def test_first_step_equals_the_in_process_teachers(straight, tmp_path):
    assert run_loop(tmp_path, "teacher.server.enabled=false", "checkpointing.enabled=false") == 0
    served, local = straight[1][1], read_metrics(tmp_path)[1]
    assert served["train/loss"] == pytest.approx(local["train/loss"], abs=1e-4)
    assert served["train/reverse_kl"] == pytest.approx(local["train/reverse_kl"], abs=1e-4)
    assert served["teacher/server_retries"] == 0 and "teacher/server_retries" not in local


def test_a_served_teacher_with_its_own_chat_template(server, tmp_path, capsys):
    """The served teacher read through another chat template (a "Q: " before every user
    message): the run writes the teacher's rows in its own rendering and the server scores
    them, the same rollouts as the in-process teacher with the same template. The served run
    has no Ray (cluster.executor=local), as on a machine without it."""
    from transformers import AutoTokenizer

    template = AutoTokenizer.from_pretrained(resolve_pretrained("tiny:tokenizer")).chat_template
    other = template.replace("message['role'] + '\\n' + message['content']", (
        "message['role'] + '\\nQ: ' + message['content']"
    ))  # fmt: skip
    (tmp_path / "template.jinja").write_text(other)
    crossed = (f"teacher.tokenizer.chat_template={tmp_path / 'template.jinja'}",)
    url = f"teacher.server.base_url={server.base_url}"
    no_ray = ("cluster.executor=local", "checkpointing.enabled=false")
    assert run_loop(tmp_path / "served", url, *crossed, *no_ray) == 0
    assert "workers: one process (cluster.executor local, no Ray)" in capsys.readouterr().out
    local_args = ("teacher.server.enabled=false", "checkpointing.enabled=false", *crossed)
    assert run_loop(tmp_path / "local", *local_args) == 0
    served, local = read_metrics(tmp_path / "served")[1], read_metrics(tmp_path / "local")[1]
    assert served["train/reverse_kl"] == pytest.approx(local["train/reverse_kl"], abs=1e-4)
    assert served["teacher/xtok_mapped_mass"] == pytest.approx(1.0, abs=1e-4)


def refused(tmp_path, capsys, *overrides: str) -> str:
    assert run_loop(tmp_path, *overrides) == EXIT_CONFIG_ERROR
    return capsys.readouterr().err


def test_a_server_that_does_not_answer(server, tmp_path, capsys):
    url = f"http://127.0.0.1:{free_port()}/v1"
    err = refused(
        tmp_path,
        capsys,
        f"teacher.server.base_url={url}",
        "teacher.server.max_retries=1",
        "teacher.server.retry_backoff_s=0.01",
    )
    assert f"no teacher server answers at {url} (1 retries; last: ConnectError" in err
    assert "python -m nemo_opd.teacher_server" in err


def test_a_model_the_server_does_not_serve(server, tmp_path, capsys):
    err = refused(
        tmp_path,
        capsys,
        f"teacher.server.base_url={server.base_url}",
        "teacher.server.model_name=big",
    )
    assert f"{server.base_url} serves ['tiny:teacher'], not 'big'" in err


def test_fewer_logprobs_than_the_runs_topk(server, tmp_path, capsys):
    # The server was started for top-16 (--max-logprobs 16).
    err = refused(
        tmp_path,
        capsys,
        f"teacher.server.base_url={server.base_url}",
        "distillation.topk_logits_k=32",
    )
    assert "cannot return the top 32 log-probs" in err and "--max-logprobs >= 32" in err


def test_a_context_shorter_than_the_runs_sequences(server, tmp_path, capsys):
    # The server holds 129 tokens (the config's 128 plus one).
    err = refused(
        tmp_path,
        capsys,
        f"teacher.server.base_url={server.base_url}",
        "policy.max_total_sequence_length=200",
    )
    assert "with a context of 129 tokens" in err and "--max-model-len >= 201" in err


def test_a_teacher_tokenizer_that_differs_from_the_servers(server, tmp_path, capsys):
    # teacher.tokenizer is how the run writes the teacher's rows: the server must read them so
    records = build_tiny_math_splits(TinyMathConfig(num_train=300, num_validation=5, seed=9))
    other = build_tiny_tokenizer(records["train"], 260, 2, 128)
    other.save_pretrained(tmp_path / "other")
    err = refused(
        tmp_path,
        capsys,
        f"teacher.server.base_url={server.base_url}",
        f"teacher.tokenizer.name={tmp_path / 'other'}",
    )
    assert "the served model's tokenizer differs from the one the run reads the teacher" in err


@pytest.fixture
def endpoint(server):
    """(base URL, served model name) of the module's server, for ServedTeacher itself."""
    return server.base_url, "tiny:teacher"


@pytest.fixture(scope="module")
def reference_model():
    path = resolve_pretrained("tiny:teacher")
    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()


def reference_logprobs(model, batch):
    """[B, S, V] fp32 log-probs of each row's own forward; zeros beyond its length."""
    ids, lengths = batch["input_ids"], batch["input_lengths"]
    out = torch.zeros(*ids.shape, model.config.vocab_size)
    with torch.no_grad():
        for row, length in enumerate(lengths.tolist()):
            logits = model(ids[row : row + 1, :length]).logits[0].float()
            out[row, :length] = torch.log_softmax(logits, dim=-1)
    return out


def test_topk_matches_the_teachers_forward_on_ragged_rows(endpoint, reference_model):
    batch = ragged_batch([23, 7, 40, 1, 31], width=44)
    teacher = ServedTeacher(*endpoint, rows_per_request=2)
    values, indices = teacher.get_topk_logits(batch, K)
    assert values.shape == indices.shape == (5, 44, K)
    assert (values.dtype, indices.dtype) == (torch.float32, torch.int32)
    full = reference_logprobs(reference_model, batch)
    expected = full.topk(K, dim=-1).values
    # The ids: the reference's log-prob of every returned id is the value returned with it
    # (near-ties of random tokens may come in either order, so ids are not compared directly).
    at_ids = full.gather(2, indices.long())
    for row, length in enumerate(batch["input_lengths"].tolist()):
        served = values[row, :length]
        torch.testing.assert_close(served, expected[row, :length], atol=1e-4, rtol=0)
        torch.testing.assert_close(at_ids[row, :length], served, atol=1e-4, rtol=0)
        assert not values[row, length:].any() and not indices[row, length:].any()


def test_sampled_token_logprobs_match_the_teachers_forward(endpoint, reference_model):
    batch = ragged_batch([12, 30, 2], seed=1)
    logprobs = ServedTeacher(*endpoint).get_logprobs(batch)
    full = reference_logprobs(reference_model, batch)
    ids = batch["input_ids"]
    for row, length in enumerate(batch["input_lengths"].tolist()):
        targets = ids[row, 1:length]
        expected = full[row, : length - 1].gather(1, targets.unsqueeze(1)).squeeze(1)
        torch.testing.assert_close(logprobs[row, : length - 1], expected, atol=1e-4, rtol=0)
        assert not logprobs[row, length - 1 :].any()  # as the in-process teacher: no next token


def test_many_concurrent_requests_keep_row_order(endpoint):
    batch = ragged_batch([5 + (row * 7) % 37 for row in range(48)], seed=2)
    one_request = ServedTeacher(*endpoint, rows_per_request=48).get_logprobs(batch)
    many = ServedTeacher(*endpoint, rows_per_request=1, max_concurrency=6)
    assert torch.equal(many.get_logprobs(batch), one_request)
    assert many.retries == 0


def test_more_logprobs_than_the_server_allows_is_refused_with_its_message(endpoint):
    # The command started the server with --max-logprobs = distillation.topk_logits_k (16).
    with pytest.raises(ServedTeacherError, match="refused the request .*greater than max allowed"):
        ServedTeacher(*endpoint).get_topk_logits(ragged_batch([6]), 17)


def test_equals_the_in_process_teacher_on_a_ragged_batch(endpoint):
    # The DTensor teacher the loop starts for the same config (here in this process, the
    # local executor, which computes as a Ray worker does: test_policy_executors), same batch:
    # top-k values, the ids' log-probs and the sampled-token log-probs within 1e-4, and the
    # same zeros; the served teacher is a drop-in for it.
    from nemo_opd.config import load_config
    from nemo_opd.policy.policy import Policy

    cfg = load_config(TINY)
    model = resolve_pretrained(cfg.teacher.model_name)
    tokenizer = cfg.teacher.tokenizer.model_copy(update={"name": model})
    teacher_cfg = cfg.teacher.model_copy(update={"model_name": model, "tokenizer": tokenizer})
    batch = ragged_batch([9, 33, 17, 1, 26], seed=3, width=40)
    local = Policy(teacher_cfg, cfg.cluster, optimizer=False, name="teacher", executor="local")
    try:
        values, indices = local.get_topk_logits(batch, K)
        logprobs = local.get_logprobs(batch)
    finally:
        local.shutdown()
    served = ServedTeacher(*endpoint)
    served_values, served_indices = served.get_topk_logits(batch, K)
    torch.testing.assert_close(served_values, values, atol=1e-4, rtol=0)
    agree = served_indices == indices
    assert agree.float().mean() > 0.99  # the rest: near-ties in either order (values agree)
    torch.testing.assert_close(served.get_logprobs(batch), logprobs, atol=1e-4, rtol=0)


def kill_after_step(server: TeacherServer, run_dir: Path, step: int) -> threading.Thread:
    """A thread that kills the server as soon as the run has logged `step`."""

    def watch() -> None:
        deadline = time.monotonic() + 600
        while step not in read_metrics(run_dir) and time.monotonic() < deadline:
            time.sleep(0.05)
        server.kill()

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread


def test_a_server_killed_mid_run_then_restarted_resumes_exactly(server, straight, tmp_path, capsys):
    # Last in the module: it kills the module's server (and starts it again).
    args = (
        f"teacher.server.base_url={server.base_url}",
        "cluster.executor=local",  # the server's process boundary, not Ray's, is under test
        "distillation.val_at_end=true",
        "teacher.server.max_retries=2",
        "teacher.server.retry_backoff_s=0.05",
        *OVERLAP,
    )
    killer = kill_after_step(server, tmp_path, 1)
    assert run_loop(tmp_path, *args, steps=STEPS) == EXIT_RUN_FAILED
    killer.join()
    err = capsys.readouterr().err
    done = max(read_metrics(tmp_path))  # the kill lands in step 2, rarely later
    assert 1 <= done < STEPS, err[-2000:]
    checkpoints = tmp_path / "checkpoints"
    assert f"the teacher server at {server.base_url} did not answer after 2 retries" in err
    assert f"(step {done}, the last completed, is saved in {checkpoints})" in err
    assert "Traceback" not in err.split("error: ")[-1]
    assert sorted(p.name for p in checkpoints.glob("step_*")) == [f"step_{done}"]

    server.start(attempts=1)  # on the port the run knows
    assert run_loop(tmp_path, *args, steps=STEPS) == 0
    assert f"resumed from {checkpoints / f'step_{done}'}" in capsys.readouterr().out
    assert_resumed_like(read_metrics(tmp_path), straight[1], straight[1])
