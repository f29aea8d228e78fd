"""Plots: run discovery (node dir, demo dir, --compare dir, several runs), PNGs, `swarm-node plot`."""

import json
import struct

import pytest
import yaml
from typer.testing import CliRunner

from swarm_node.commands.cli import app
from swarm_node.commands.demo import plots

runner = CliRunner()


def fake_node(out, name, model="tiny-s", lora_r=0, rounds=20, start=0.2, gain=0.01, eval_every=5):
    """A node output dir as `swarm-node train/join` writes it: metrics.jsonl + config.yaml."""
    out.mkdir(parents=True)
    rows = []
    for r in range(rounds + 1):
        row = {"round": r, "node": name}
        if r > 0:
            row.update({"reward/mean": 0.1 + 0.005 * r, "filter/dropped_frac": 0.05, "is/truncated_frac": 0.01,
                        "swarm/peers": 2, "swarm/peer_groups_used": 4})
        if r % eval_every == 0 or r == rounds:
            row.update({"eval/accuracy": start + gain * r, "eval/n": 200})
        rows.append(row)
    (out / "metrics.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows) + '{"round": 99, "tor')
    (out / "config.yaml").write_text(yaml.safe_dump({"name": name, "model": {"name": model, "lora_r": lora_r}}))
    return out


def png_size(path):
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is not a PNG"
    return struct.unpack(">II", data[16:24])


def test_single_node_dir_and_torn_last_line(tmp_path):
    node = fake_node(tmp_path / "run", "a")
    [series] = plots.load_runs([node])
    assert series.node == "a" and series.kind == "" and series.description == "tiny-s, full"
    rounds, acc = series.points("eval/accuracy")
    assert rounds == [0, 5, 10, 15, 20] and acc[0] == pytest.approx(0.2) and acc[-1] == pytest.approx(0.4)
    [row] = plots.accuracy_table([series])
    assert row["start"] == pytest.approx(0.2) and row["end"] == pytest.approx(0.4) and row["n"] == 200


def test_demo_dir_keeps_the_demo_node_order(tmp_path):
    run = tmp_path / "demo"
    for name in ("zeta", "alpha", "mid"):
        fake_node(run / name, name, lora_r=8 if name == "mid" else 0)
    assert [s.node for s in plots.load_runs([run])] == ["alpha", "mid", "zeta"]  # alphabetical without demo.json
    (run / "demo.json").write_text(json.dumps({"nodes": ["zeta", "alpha", "mid"], "kinds": ["swarm-f-tis"]}))
    series = plots.load_runs([run])
    assert [s.node for s in series] == ["zeta", "alpha", "mid"]
    assert series[2].description == "tiny-s, LoRA r=8"


def test_compare_layout_draws_compare_png(tmp_path):
    run = tmp_path / "cmp"
    for k, kind in enumerate(("swarm-f-tis", "swarm-nois", "alone")):
        for name in ("s", "m"):
            fake_node(run / kind / name, name, gain=0.01 / (k + 1))
    (run / "demo.json").write_text(json.dumps({"nodes": ["s", "m"], "kinds": ["swarm-f-tis", "swarm-nois", "alone"]}))
    series = plots.load_runs([run])
    assert [(s.kind, s.node) for s in series][:3] == [("swarm-f-tis", "s"), ("swarm-f-tis", "m"), ("swarm-nois", "s")]
    paths = plots.plot_runs([run])
    assert sorted(p.name for p in paths) == ["accuracy.png", "compare.png", "training.png"]
    width, height = png_size(run / "compare.png")
    assert width > 2 * height  # one panel per node, side by side


def test_plot_command_several_runs(tmp_path):
    a, b = fake_node(tmp_path / "exp-a", "n1"), fake_node(tmp_path / "exp-b", "n1", gain=0.02)
    out = tmp_path / "figs"
    result = runner.invoke(app, ["plot", str(a), str(b), "--out", str(out)])
    assert result.exit_code == 0, result.output
    for name in ("accuracy.png", "training.png", "compare.png"):
        assert f"wrote {out / name}" in result.output
        width, height = png_size(out / name)
        assert width >= 600 and height >= 300
    kinds = {s.kind for s in plots.load_runs([a, b])}
    assert kinds == {"exp-a", "exp-b"}  # several run dirs: the run's name tells the lines apart


def test_plot_defaults_to_the_run_dir(tmp_path):
    run = fake_node(tmp_path / "one", "x")
    result = runner.invoke(app, ["plot", str(run)])
    assert result.exit_code == 0, result.output
    assert (run / "accuracy.png").exists() and (run / "training.png").exists()
    assert not (run / "compare.png").exists()


def test_plot_without_metrics_is_one_clear_line(tmp_path):
    result = runner.invoke(app, ["plot", str(tmp_path)])
    assert result.exit_code == 2
    assert "error: no metrics.jsonl under" in result.output and "Traceback" not in result.output
    result = runner.invoke(app, ["plot", str(tmp_path / "missing")])
    assert result.exit_code == 2 and "is not a directory" in result.output


def test_training_plot_without_filter_metrics(tmp_path):
    """An alone run with a loss that logs no filter stats still gets both panels (one says so)."""
    out = tmp_path / "plain"
    out.mkdir()
    rows = [{"round": 0, "eval/accuracy": 0.1, "eval/n": 10}] + [{"round": r, "reward/mean": 0.1} for r in (1, 2, 3)]
    (out / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    plots.plot_runs([out])
    png_size(out / "training.png")


def test_smooth_is_a_trailing_mean():
    assert plots.smooth([1, 2, 3, 4], 2) == [1, 1.5, 2.5, 3.5]
    assert plots.smooth([], 3) == []
