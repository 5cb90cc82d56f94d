"""What setup checks from every node (tests/functional/test_multinode_tiny.py has a node that
cannot see a directory): which paths, and how each node looks at them."""

from pathlib import Path

from ray_local import shared_ray

from nemo_opd.config import load_config
from nemo_opd.distributed.nodes import alive_nodes
from nemo_opd.distributed.shared_paths import (
    SharedPath,
    check_shared_paths,
    fingerprint,
    paths_workers_use,
)
from nemo_opd.utils.run_dirs import with_absolute_paths

TINY_CONFIG = (
    Path(__file__).resolve().parents[3] / "examples" / "configs" / "distillation_tiny.yaml"
)


def test_the_checkpoint_dir_and_local_models_but_not_hub_names(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "student").mkdir()
    cfg = with_absolute_paths(
        load_config(
            TINY_CONFIG,
            [
                "policy.model_name=student",
                "policy.tokenizer.name=Qwen/Qwen3-0.6B",
                "checkpointing.checkpoint_dir=ckpt",
            ],
        )
    )
    assert paths_workers_use(cfg) == [
        SharedPath("checkpointing.checkpoint_dir", str(tmp_path / "ckpt"), writes=True),
        SharedPath("policy.model_name", str(tmp_path / "student")),
    ]  # tiny:teacher and tiny:tokenizer are resolved later, into the asset cache


def test_a_served_teacher_is_not_looked_for(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "teacher").mkdir()
    served = ["teacher.model_name=teacher", "teacher.server.enabled=true"]
    served.append("teacher.server.base_url=http://127.0.0.1:8000")
    cfg = load_config(TINY_CONFIG, served)
    assert [path.key for path in paths_workers_use(cfg)] == ["checkpointing.checkpoint_dir"]


def test_fingerprint_names_and_sizes_of_a_directorys_own_files(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "weights").write_bytes(b"x" * 10)
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "ignored").write_text("deeper")
    assert fingerprint(str(tmp_path)) == [("config.json", 2), ("weights", 10)]
    assert fingerprint(str(tmp_path / "weights")) == [("weights", 10)]
    assert fingerprint(str(tmp_path / "missing")) is None


def test_nothing_to_look_at_on_the_drivers_own_node(tmp_path):
    with shared_ray(1, user=__name__):
        checkpoints = SharedPath("checkpointing.checkpoint_dir", str(tmp_path), writes=True)
        check_shared_paths([checkpoints], alive_nodes())
    assert list(tmp_path.iterdir()) == []  # no marker written
