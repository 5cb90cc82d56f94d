"""A checkpoint write that fails says why: free space and the process's file-size limit.
nemo_opd.json names what it counts (optimizer steps, not the loop's step of step_<N>/)."""

import json
import subprocess
import sys
import textwrap
from pathlib import Path

from nemo_opd.policy.engines.training_state import META_FILE, read_step, write_training_state


def test_a_save_over_the_file_size_limit_names_the_limit(tmp_path):
    # In a child process: the limit applies to the whole process that sets it.
    code = textwrap.dedent(
        f"""
        import resource, torch
        from pathlib import Path
        from nemo_opd.policy.engines.training_state import write_training_state, write_weights
        resource.setrlimit(resource.RLIMIT_FSIZE, (50_000, 50_000))
        optimizer = {{"state": {{0: {{"exp_avg": torch.zeros(100_000)}}}}, "param_groups": []}}
        try:
            weights, config = {{"w": torch.zeros(10)}}, {{"dtype": "float32"}}
            write_weights(Path({str(tmp_path)!r}), weights, config)
            write_training_state(Path({str(tmp_path)!r}), optimizer, None, [], 3)
        except OSError as error:
            print("OSError:", error)
        """
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.startswith(f"OSError: writing {tmp_path}/training_state.pt failed")
    assert "MiB free on its filesystem" in result.stdout
    assert "may not write files over 50,000 bytes (ulimit -f)" in result.stdout


def test_the_policy_checkpoint_counts_optimizer_steps_not_loop_steps(tmp_path):
    # step_1/policy of a run with two optimizer steps per loop step: "step": 2 there read as
    # the wrong step; the file says what it counts.
    write_training_state(tmp_path, None, None, [], 2)
    assert json.loads((tmp_path / META_FILE).read_text()) == {"optimizer_steps": 2}
    assert read_step(tmp_path, default=0) == 2
    older = Path(tmp_path / "older")
    older.mkdir()
    (older / META_FILE).write_text(json.dumps({"step": 5}))  # written before the rename
    assert read_step(older, default=0) == 5
    assert read_step(tmp_path / "none", default=7) == 7
