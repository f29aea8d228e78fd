"""CLI: commands parse, user errors are one line (no traceback), train/eval run end to end."""

import subprocess
import sys

from typer.testing import CliRunner

from swarm_node.commands.cli import app

runner = CliRunner()


def test_help_lists_commands():
    result = runner.invoke(app, ["--help"])
    assert result.exit_code == 0
    for command in ("train", "join", "eval", "protocol"):
        assert command in result.output


def test_bad_config_value_is_one_clear_line(tmp_path):
    result = runner.invoke(app, ["train", "--set", "train.lrr=3", "--out", str(tmp_path)])
    assert result.exit_code == 2
    assert "error: unknown config key 'train.lrr'" in result.output
    assert "Traceback" not in result.output


def test_unknown_model_is_one_clear_line(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "swarm_node", "eval", "--model", str(tmp_path / "missing")],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert "error: cannot load model" in proc.stderr and "Traceback" not in proc.stderr


def test_train_then_eval_the_checkpoint(tmp_path):
    out = tmp_path / "run"
    result = runner.invoke(app, ["train", "--model", "tiny-s", "--rounds", "1", "--out", str(out),
                                 "--set", "rollout.group_size=2", "--set", "rollout.max_new_tokens=4",
                                 "--set", "task.eval_limit=4", "--set", "threads=1",
                                 "--set", "train.warmstart_steps=0", "--set", "rollout.prompts_per_round=2"])
    assert result.exit_code == 0, result.output
    assert (out / "metrics.jsonl").exists() and (out / "node.log").exists()
    model = out / "checkpoints" / "round-000001" / "model"
    result = runner.invoke(app, ["eval", "--model", str(model), "--task", "arith", "--limit", "5",
                                 "--max-new-tokens", "4"])
    assert result.exit_code == 0, result.output
    assert "arith pass@1 = " in result.output and "on 5 examples" in result.output


def test_bad_task_option_is_one_clear_line(tmp_path):
    result = runner.invoke(app, ["train", "--set", "task.options={digit: 2}", "--out", str(tmp_path)])
    assert result.exit_code == 2
    assert "error: bad options for task 'arith'" in result.output and "Traceback" not in result.output


def test_a_bug_shows_its_traceback_and_a_user_error_does_not(tmp_path):
    """Only user-caused errors (SwarmNodeError) become one `error:` line; a programmer error, here a
    shape mismatch planted in the trainer (the loss raises ValueError for it, which the CLI used to
    swallow as a user error), must reach the user with its full traceback."""
    planted = ("import sys, torch, swarm_node.train.loss as loss, swarm_node.train.trainer as t\n"
               "t.Trainer.step = lambda self, groups, untrusted=None: loss.group_advantages(torch.zeros(2), torch.zeros(3))\n"
               "from swarm_node.commands.cli import app\n"
               "sys.argv = ['swarm-node'] + sys.argv[1:]\n"
               "app()\n")
    args = ["train", "--rounds", "1", "--out", str(tmp_path / "run"), "--set", "task.eval_limit=2",
            "--set", "rollout.max_new_tokens=2", "--set", "threads=1", "--set", "train.warmstart_steps=0", "--set", "rollout.prompts_per_round=2"]
    bug = subprocess.run([sys.executable, "-c", planted, *args], capture_output=True, text=True, timeout=300)
    assert bug.returncode == 1, bug.stderr[-2000:]
    assert "Traceback (most recent call last)" in bug.stderr
    assert "ValueError: rewards and group_ids must both be [N]" in bug.stderr
    assert "\nerror: " not in bug.stderr
    user = subprocess.run([sys.executable, "-m", "swarm_node", *args, "--set", "rollout.group_size=1"],
                          capture_output=True, text=True, timeout=300)
    assert user.returncode == 2
    assert user.stderr.strip().splitlines()[-1].startswith("error: rollout.group_size must be >= 2")
    assert "Traceback" not in user.stderr
