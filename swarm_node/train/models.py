"""Real models: the names people type, why one cannot be loaded, and what it costs in memory.

    resolve_model_name("Qwen2.5-3B")      -> "Qwen/Qwen2.5-3B" (Qwen2.5 and Qwen2.5-Coder, all sizes,
                                             -Instruct too); presets, local paths, hub ids unchanged
    resolve_model_name("smollm2-135m")    -> its installed directory (sources.py), else its hub id
    model_load_error(name, resolved, exc) -> the one line a user sees when loading fails
    hub_reachable()                       -> whether the Hugging Face hub answers (3 s, not 46 s of retries)
    ModelDims                             -> the sizes memory depends on: from a transformers config,
                                             a preset, or the published Qwen2.5 table (no download)
    plan_precision(device, full_finetune) -> which dtype holds what (see below)
    estimate_memory(...)                  -> bytes for weights, grads, AdamW, activations, logits, KV cache
    fit_memory(estimate, available)       -> ok / needs gradient checkpointing / does not fit

Precision plan. CPU: everything fp32. CUDA with bf16: full fine-tuning keeps fp32 master weights
(AdamW's update at lr 1e-6 is below bf16's resolution for most weights) and computes in bf16 under
autocast; LoRA keeps the frozen base in bf16 and the adapters in fp32. CUDA without bf16
(pre-Ampere): fp32.

Memory model (per micro-batch of b sequences of length L, hidden H, MLP width I, KV width K,
compute dtype of c bytes): a Qwen2/Llama decoder layer saves for backward about
16 H (RMSNorms upcast to fp32) + c (8 H + 2 K + 4 I) bytes per token, plus 6 H when autocast
keeps bf16 copies of fp32 layer inputs; attention is assumed fused (SDPA flash/efficient: no L^2
term). Against what autograd saves on tiny-l (tests/test_models.py), estimate / measured is 1.05
(fp32), 1.11 (bf16 weights) and 0.98 (fp32 weights, bf16 autocast); the whole training step's peak,
1.16 (1.10 with gradient checkpointing). With gradient checkpointing only each layer's input
(H, in the residual stream's dtype) is kept, plus one layer recomputed in backward. Log-probs are computed `logprob_chunk` positions at a time, so
the logits peak is b x chunk x V in compute dtype plus three fp32 copies (float, log-softmax, grad).
Generation holds a KV cache for G x prompts sequences of length L. The trainer zeroes gradients at
the start of a step, so gradients of the last step are still allocated while generating.
"""

from __future__ import annotations

import os
import re
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from swarm_node.errors import SwarmNodeError
from swarm_node.train.presets import CHAR_VOCAB, PRESETS
from swarm_node.train.sources import installed, is_packaged, lookup, missing_message

__all__ = ["ModelNameError", "resolve_model_name", "model_load_error", "hub_reachable", "looks_like_path",
           "ModelDims", "QWEN25", "lora_trainable_params", "trainable_params", "plan_precision", "estimate_memory",
           "estimate_for_config", "MemoryFit", "fit_memory", "fmt_bytes"]

# ---------------------------------------------------------------------------------------------------
# Names

_FAMILY_SIZES = {"Qwen2.5": ("0.5", "1.5", "3", "7", "14", "32", "72"),
                 "Qwen2.5-Coder": ("0.5", "1.5", "3", "7", "14", "32")}
_SHORT_QWEN = re.compile(r"qwen2\.5(?P<coder>-coder)?-(?P<size>[0-9]+(?:\.[0-9]+)?)b(?P<instruct>-instruct)?",
                         re.IGNORECASE)


class ModelNameError(SwarmNodeError):
    """A model name of a known family with a size that family does not have."""


def resolve_model_name(name: str) -> str:
    """The name to load: ``Qwen2.5-3B`` -> ``Qwen/Qwen2.5-3B`` (see the module docstring).

    Presets, existing local paths and anything else (full hub ids) are returned unchanged.
    """
    typed = name.strip()
    if typed in PRESETS or Path(typed).expanduser().exists():
        return typed
    if is_packaged(typed):  # a packaged model: installed here, else the hub (loaded only if it answers)
        path = installed(typed)
        return str(path) if path is not None else lookup(typed).hub_id or typed
    m = _SHORT_QWEN.fullmatch(typed)
    if m is None:
        return typed
    family = "Qwen2.5-Coder" if m["coder"] else "Qwen2.5"
    if m["size"] not in _FAMILY_SIZES[family]:
        sizes = ", ".join(f"{s}B" for s in _FAMILY_SIZES[family])
        raise ModelNameError(f"{family} has no {m['size']}B model (sizes: {sizes}); "
                             f"pass a full hub id (owner/name) for a model not in this list")
    return f"Qwen/{family}-{m['size']}B" + ("-Instruct" if m["instruct"] else "")


def _chain(exc: BaseException) -> list[BaseException]:
    """``exc`` and its causes/contexts, outermost first (cycles cut)."""
    seen: list[BaseException] = []
    while exc is not None and all(exc is not e for e in seen):
        seen.append(exc)
        exc = exc.__cause__ or exc.__context__
    return seen


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0][:160]}" if text else type(exc).__name__


def looks_like_path(name: str) -> bool:
    """Whether ``name`` is written as a filesystem path (not a hub id ``owner/name``)."""
    return name.startswith(("/", "./", "../", "~")) or name.count("/") > 1


def model_load_error(name: str, resolved: str, exc: BaseException) -> str:
    """One line saying which model could not be loaded, why, and what to do instead."""
    from huggingface_hub import errors as hub

    head = f"cannot load model {name!r}" + (f" (resolved to hub id {resolved!r})" if resolved != name else "")
    chain = _chain(exc)
    if is_packaged(name) and installed(name) is None:
        return missing_message(name, _first_line(chain[-1]))
    kinds = tuple(type(e) for e in chain)
    download = (f"download it where the hub is reachable (`hf download {resolved} --local-dir DIR`), "
                "copy DIR here and pass --model DIR")
    if looks_like_path(resolved) or Path(resolved).expanduser().exists():
        path = Path(resolved).expanduser()
        if not path.exists():
            return f"{head}: no such local directory; check the path, or pass a hub id such as Qwen/Qwen2.5-3B"
        if not (path / "config.json").is_file():
            return (f"{head}: {path} is not a model directory (no config.json); pass the directory that "
                    "save_pretrained or `hf download --local-dir` wrote")
        return f"{head}: the local directory could not be loaded ({_first_line(chain[-1])})"
    if any(issubclass(k, hub.GatedRepoError) for k in kinds):
        return f"{head}: the model is gated on the hub; accept its license on huggingface.co and run `hf auth login`"
    if any(issubclass(k, hub.RepositoryNotFoundError) for k in kinds):
        return (f"{head}: no such model on the Hugging Face hub (or it is private); check the name "
                "(short names like Qwen2.5-3B are resolved) or run `hf auth login`")
    if any(issubclass(k, hub.HFValidationError) for k in kinds):
        return f"{head}: not a preset, an existing local directory or a valid hub id (owner/name)"
    if any(issubclass(k, (hub.LocalEntryNotFoundError, hub.OfflineModeIsEnabled, ConnectionError, TimeoutError))
           or "connect" in k.__name__.lower() for k in kinds) or "couldn't connect" in str(exc):
        why = ("HF_HUB_OFFLINE is set" if _hub_offline() else
               f"the Hugging Face hub is not reachable ({_first_line(chain[-1])})")
        return f"{head}: {why} and the model is not in the local Hugging Face cache; {download}"
    return f"{head}: {_first_line(chain[-1])} (SWARM_NODE_DEBUG=1 shows the traceback)"


def _hub_offline() -> bool:
    """Whether huggingface_hub runs offline (it reads HF_HUB_OFFLINE once, at import)."""
    try:
        from huggingface_hub import is_offline_mode
    except ImportError:  # an older huggingface_hub
        return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")
    return bool(is_offline_mode())


def hub_reachable(timeout_s: float = 3.0) -> tuple[bool, str]:
    """Whether the Hugging Face hub endpoint answers within ``timeout_s``; (False, why) if not."""
    if _hub_offline():
        return False, "HF_HUB_OFFLINE is set"
    endpoint = os.environ.get("HF_ENDPOINT", "https://huggingface.co").rstrip("/")
    try:
        urllib.request.urlopen(urllib.request.Request(endpoint, method="HEAD"), timeout=timeout_s).close()
    except urllib.error.HTTPError:
        return True, endpoint  # it answered, even if with an error status
    except (urllib.error.URLError, OSError, ValueError) as e:
        return False, f"{endpoint}: {getattr(e, 'reason', e)}"
    return True, endpoint


# ---------------------------------------------------------------------------------------------------
# Sizes

@dataclass(frozen=True)
class ModelDims:
    """The architecture sizes of a Qwen2/Llama-style decoder that memory depends on."""

    hidden: int
    layers: int
    heads: int
    kv_heads: int
    intermediate: int
    vocab: int
    tied: bool  # input and output embeddings share one matrix
    qkv_bias: bool = True  # Qwen2 has biases on q/k/v projections; Llama does not

    @property
    def kv_dim(self) -> int:
        return self.kv_heads * (self.hidden // self.heads)

    @property
    def n_params(self) -> int:
        """Parameter count of the causal LM (embeddings, layers, final norm, untied head)."""
        H, K, I = self.hidden, self.kv_dim, self.intermediate
        attention = 2 * H * H + 2 * H * K + (H + 2 * K if self.qkv_bias else 0)
        layer = attention + 3 * H * I + 2 * H  # + MLP (gate, up, down) + two RMSNorms
        return self.vocab * H * (1 if self.tied else 2) + self.layers * layer + H

    @classmethod
    def from_hf_config(cls, config) -> ModelDims:
        """From a transformers config (e.g. ``Qwen2Config``, ``AutoConfig.from_pretrained(dir)``)."""
        heads = config.num_attention_heads
        return cls(hidden=config.hidden_size, layers=config.num_hidden_layers, heads=heads,
                   kv_heads=getattr(config, "num_key_value_heads", None) or heads,
                   intermediate=config.intermediate_size, vocab=config.vocab_size,
                   tied=bool(getattr(config, "tie_word_embeddings", False)),
                   qkv_bias=bool(getattr(config, "attention_bias", config.model_type == "qwen2")))

    @classmethod
    def lookup(cls, name: str) -> ModelDims | None:
        """Sizes without downloading anything: a preset, a local model directory, or a known hub id."""
        if name in PRESETS:
            p = PRESETS[name]
            return cls(p["hidden_size"], p["num_hidden_layers"], p["num_attention_heads"],
                       p["num_key_value_heads"], p["intermediate_size"], len(CHAR_VOCAB), tied=True)
        if (Path(name).expanduser() / "config.json").is_file():
            from transformers import AutoConfig

            return cls.from_hf_config(AutoConfig.from_pretrained(str(Path(name).expanduser())))
        short = name.split("/", 1)[1] if name.startswith("Qwen/") else None
        if short is None:
            return None
        return QWEN25.get(short.removesuffix("-Instruct").replace("-Coder", ""))


#: Published architectures of Qwen2.5 (the -Coder and -Instruct models of a size share them).
QWEN25 = {
    "Qwen2.5-0.5B": ModelDims(896, 24, 14, 2, 4864, 151936, tied=True),
    "Qwen2.5-1.5B": ModelDims(1536, 28, 12, 2, 8960, 151936, tied=True),
    "Qwen2.5-3B": ModelDims(2048, 36, 16, 2, 11008, 151936, tied=True),
    "Qwen2.5-7B": ModelDims(3584, 28, 28, 4, 18944, 152064, tied=False),
    "Qwen2.5-14B": ModelDims(5120, 48, 40, 8, 13824, 152064, tied=False),
    "Qwen2.5-32B": ModelDims(5120, 64, 40, 8, 27648, 152064, tied=False),
    "Qwen2.5-72B": ModelDims(8192, 80, 64, 8, 29568, 152064, tied=False),
}

_LORA_SHAPES = {"q_proj": ("H", "H"), "k_proj": ("H", "K"), "v_proj": ("H", "K"), "o_proj": ("H", "H"),
                "gate_proj": ("H", "I"), "up_proj": ("H", "I"), "down_proj": ("I", "H")}


def lora_trainable_params(dims: ModelDims, r: int, targets: list[str]) -> int:
    """Parameters of rank-``r`` LoRA adapters (A: in x r, B: r x out) on ``targets`` in every layer."""
    size = {"H": dims.hidden, "K": dims.kv_dim, "I": dims.intermediate}
    unknown = sorted(set(targets) - set(_LORA_SHAPES))
    if unknown:
        raise ValueError(f"unknown LoRA target(s) {unknown}; known: {', '.join(_LORA_SHAPES)}")
    return dims.layers * sum(r * (size[_LORA_SHAPES[t][0]] + size[_LORA_SHAPES[t][1]]) for t in targets)


def trainable_params(cfg, dims: ModelDims) -> int:
    """Parameters a `NodeConfig` trains: all of them, or its LoRA adapters."""
    if cfg.model.lora_r == 0:
        return dims.n_params
    return lora_trainable_params(dims, cfg.model.lora_r, list(cfg.model.lora_targets))


# ---------------------------------------------------------------------------------------------------
# Precision and memory

_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


def plan_precision(device_type: str, full_finetune: bool, bf16_supported: bool = True) -> dict:
    """Dtype names for compute, trainable weights (AdamW's master copy), frozen weights, and autocast."""
    if device_type != "cuda" or not bf16_supported:
        why = "CPU" if device_type != "cuda" else "this GPU has no bf16"
        return {"compute": "float32", "trainable": "float32", "frozen": "float32", "autocast": False,
                "note": f"fp32 everywhere ({why})"}
    if full_finetune:
        return {"compute": "bfloat16", "trainable": "float32", "frozen": "float32", "autocast": True,
                "note": "bf16 compute (autocast), fp32 master weights and AdamW states"}
    return {"compute": "bfloat16", "trainable": "float32", "frozen": "bfloat16", "autocast": False,
            "note": "bf16 frozen base, fp32 LoRA adapters"}


def estimate_memory(n_params: int, n_trainable: int, hidden: int, layers: int, vocab: int, group_size: int,
                    prompts_per_round: int, max_len: int, micro_batch: int, precision: dict, *,
                    intermediate: int | None = None, kv_dim: int | None = None,
                    logprob_chunk: int = 64, guard: bool = False) -> dict[str, int]:
    """Bytes per part and the peaks of a round (see the module docstring for the model).

    ``max_len`` is the longest sequence (prompt + completion tokens); ``intermediate`` and
    ``kv_dim`` default to 4 H and H (pass the real ones: Qwen2.5-3B has 11008 and 256).
    Keys: weights, grads, optimizer, activations, activations_checkpointed, logits_chunk, kv_cache,
    generation_logits, train_peak, train_peak_checkpointed, generate_peak, total, total_checkpointed.
    """
    H, I, K = hidden, intermediate or 4 * hidden, kv_dim or hidden
    c, trainable = _BYTES[precision["compute"]], _BYTES[precision["trainable"]]
    frozen = _BYTES[precision["frozen"]]
    residual = 4 if precision["autocast"] or c == 4 else c
    per_token_layer = 16 * H + c * (8 * H + 2 * K + 4 * I) + (6 * H if precision["autocast"] else 0)
    tokens = micro_batch * max_len
    sequences = group_size * prompts_per_round
    part = {
        "weights": n_trainable * trainable + (n_params - n_trainable) * frozen,
        "grads": n_trainable * trainable,
        "optimizer": 2 * n_trainable * trainable,  # AdamW: exp_avg and exp_avg_sq, in the weights' dtype
        "guard": 3 * n_trainable * trainable if guard else 0,  # the reference's weights and AdamW states
        "activations": tokens * layers * per_token_layer,
        "activations_checkpointed": tokens * layers * H * residual + tokens * per_token_layer,
        "logits_chunk": micro_batch * min(logprob_chunk, max_len) * vocab * (c + 3 * 4),
        "kv_cache": 2 * layers * K * sequences * max_len * c,
        "generation_logits": 3 * sequences * vocab * 4,  # last position only: logits, log-softmax, probs
    }
    persistent = part["weights"] + part["optimizer"] + part["guard"]
    part["train_peak"] = persistent + part["grads"] + part["activations"] + part["logits_chunk"]
    part["train_peak_checkpointed"] = (persistent + part["grads"] + part["activations_checkpointed"]
                                       + part["logits_chunk"])
    part["generate_peak"] = persistent + part["grads"] + part["kv_cache"] + part["generation_logits"]
    part["total"] = max(part["train_peak"], part["generate_peak"])
    part["total_checkpointed"] = max(part["train_peak_checkpointed"], part["generate_peak"])
    return part


def estimate_for_config(cfg, dims: ModelDims, device_type: str, bf16_supported: bool, prompt_tokens: int,
                        guard: bool) -> dict:
    """`estimate_memory` for a `NodeConfig` (full fine-tuning or LoRA) on `device_type`, plus its "precision" plan;
    `guard`: the node keeps the swarm guard's reference copy."""
    precision = plan_precision(device_type, cfg.model.lora_r == 0, bf16_supported)
    trainable = trainable_params(cfg, dims)
    estimate = estimate_memory(dims.n_params, trainable, dims.hidden, dims.layers, dims.vocab, cfg.rollout.group_size,
                               cfg.rollout.prompts_per_round, prompt_tokens + cfg.rollout.max_new_tokens,
                               cfg.train.micro_batch, precision, intermediate=dims.intermediate, kv_dim=dims.kv_dim,
                               logprob_chunk=cfg.train.logprob_chunk, guard=guard)
    return {**estimate, "precision": precision}


@dataclass(frozen=True)
class MemoryFit:
    """Whether a config fits a device: status ok|warn|fail, what it needs, what to do, and whether to checkpoint."""

    status: str
    gradient_checkpointing: bool
    message: str
    remedy: str = ""


def fmt_bytes(n: float) -> str:
    """``12.3 GiB`` (or MiB below one GiB)."""
    return f"{n / 2**30:.1f} GiB" if n >= 2**30 else f"{n / 2**20:.1f} MiB"


def fit_memory(estimate: dict[str, int], available: int, what: str = "available", usable: float = 0.9) -> MemoryFit:
    """Compare an estimate with ``available`` bytes (``what`` names them), keeping ``1 - usable`` for the CUDA
    context and fragmentation."""
    budget = usable * available
    need, need_ckpt = estimate["total"], estimate["total_checkpointed"]
    have = f"{fmt_bytes(available)} {what}"
    if need <= budget:
        return MemoryFit("ok", False, f"needs ~{fmt_bytes(need)}; {have}")
    if need_ckpt <= budget:
        return MemoryFit("warn", True, f"needs ~{fmt_bytes(need)}, ~{fmt_bytes(need_ckpt)} with gradient "
                                       f"checkpointing; {have}", "turn gradient checkpointing on")
    return MemoryFit("fail", True, f"needs ~{fmt_bytes(need_ckpt)} even with gradient checkpointing; {have}",
                     "use LoRA (--lora-r 64), a smaller train.micro_batch or rollout.max_new_tokens, or a smaller model")


def plan_node_memory(cfg, policy, prompt_tokens: int, guard: bool) -> MemoryFit:
    """The node's start-up memory check: estimate for `cfg` on the policy's device, compared with
    what that device has (a CUDA card's total memory; on CPU, the RAM available now); `guard`: with
    the swarm guard's copy."""
    import psutil
    import torch

    device = policy.device
    if device.type == "cuda":
        available, what = torch.cuda.mem_get_info(device)[1], f"on {torch.cuda.get_device_name(device)}"
        bf16 = torch.cuda.is_bf16_supported()
    else:
        available, what, bf16 = psutil.virtual_memory().available, "of RAM available", True
    estimate = estimate_for_config(cfg, ModelDims.from_hf_config(policy.model.config), device.type, bf16, prompt_tokens,
                                   guard)
    return fit_memory(estimate, available, what)
