"""The policy: a Hugging Face causal LM (optionally with a PEFT LoRA adapter) and its tokenizer.

It holds the model being trained and its tokenizer, on whatever device the model lives on:
- text <-> token ids (`encode` / `decode`), saving, the trainable parameters;
- `completion_logprobs`: log-probs of a TrainBatch's completions (batch.py) under the current
  weights (with grad), at the sampling temperature, computed in time chunks under activation
  checkpointing so a [B, T, V] logits tensor never exists, neither forward nor backward;
  `token_logprobs` does the same for lists of token ids.
Sampling lives in `train/sampling/` (the HF sampler drives this same model).

Built-in presets (presets.py) are randomly initialised models with a character tokenizer, so
tests and the demo need no downloads. Anything else is loaded with `from_pretrained` (a hub id
or a local directory, e.g. a saved preset).
"""

from __future__ import annotations

import logging
from pathlib import Path

import torch
from torch.utils.checkpoint import checkpoint

from swarm_node.config import ModelConfig
from swarm_node.errors import SwarmNodeError
from swarm_node.tasks import Task
from swarm_node.tasks.scoring import Scorer, decode, encode
from swarm_node.train.batch import pad
from swarm_node.train.models import hub_reachable, model_load_error, resolve_model_name
from swarm_node.train.presets import PRESETS, char_tokenizer, load_tokenizer, preset_model

log = logging.getLogger(__name__)

class ModelError(SwarmNodeError):
    """A model that cannot be loaded as named (not a preset, a local directory or a reachable hub id)."""


def load_pretrained(name: str, dtype: torch.dtype):
    """(model, tokenizer) from a local directory or the hub. `name` may be short (`Qwen2.5-3B`,
    resolved to `Qwen/Qwen2.5-3B`); without hub access only the local cache is tried, so a user
    gets the one-line reason in seconds rather than after the hub client's retries."""
    from transformers import AutoModelForCausalLM

    resolved = resolve_model_name(name)
    if resolved != name:
        log.info("model %s -> %s", name, resolved)
    reachable, why = (True, "") if Path(resolved).expanduser().exists() else hub_reachable()
    try:
        tokenizer = load_tokenizer(resolved, local_files_only=not reachable)
        model = AutoModelForCausalLM.from_pretrained(resolved, dtype=dtype, local_files_only=not reachable)
    except (OSError, ValueError) as e:  # without the hub, the reason is the hub, not the cache miss
        raise ModelError(model_load_error(name, resolved, e if reachable else ConnectionError(why))) from None
    return model, tokenizer


# ----------------------------------------------------------------------------------------------

def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    """The compute dtype: `auto` is bfloat16 on CUDA and float32 on CPU."""
    if name == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return getattr(torch, name)


class Policy:
    """A causal LM + tokenizer that scores completions (log-probs with grad) and saves itself.

    Precision: `compute_dtype` (config model.dtype) is what matmuls run in, under autocast.
    Parameters the optimizer updates are always float32 (master weights: a bf16 weight cannot
    absorb an AdamW update at lr ~1e-6, most updates fall below its resolution); frozen base
    weights of a LoRA node are stored in the compute dtype to save memory, its adapters in float32.
    The LM head runs in its weight's dtype with autocast off, so with float32 master weights the
    log-probs that sampling reports and that training recomputes are both float32 logits.
    """

    def __init__(self, model, tokenizer, model_id: str, device: torch.device,
                 compute_dtype: torch.dtype = torch.float32):
        self.model, self.tokenizer, self.model_id, self.device = model, tokenizer, model_id, device
        self.compute_dtype = compute_dtype
        self.chat_template, self.system_prompt = "auto", None  # how prompts are rendered (tasks/prompt.py)
        self.eos_id = tokenizer.eos_token_id
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else self.eos_id

    @classmethod
    def load(cls, cfg: ModelConfig, adapter_path: str | Path | None = None) -> "Policy":
        """Load (or build) the model named in `cfg`, wrap it with LoRA if asked, move it to its device."""
        device = resolve_device(cfg.device)
        compute = resolve_dtype(cfg.dtype, device)
        lora = adapter_path is not None or cfg.lora_r > 0
        dtype = compute if lora else torch.float32  # storage: frozen LoRA base in compute dtype, else fp32 masters
        if cfg.name in PRESETS:
            model, tokenizer = preset_model(cfg.name, cfg.init_seed), char_tokenizer()
        else:
            model, tokenizer = load_pretrained(cfg.name, dtype)
        model.to(device=device, dtype=dtype)
        if adapter_path is not None:
            from peft import PeftModel

            model = PeftModel.from_pretrained(model, str(adapter_path), is_trainable=True)
        elif cfg.lora_r > 0:
            from peft import LoraConfig, get_peft_model

            adapter = LoraConfig(r=cfg.lora_r, lora_alpha=cfg.lora_alpha or 2 * cfg.lora_r,
                                 target_modules=list(cfg.lora_targets), lora_dropout=0.0, task_type="CAUSAL_LM")
            model = get_peft_model(model, adapter)  # adapters in float32 (PEFT's autocast_adapter_dtype)
        for p in model.parameters():
            if p.requires_grad and p.dtype != torch.float32:
                p.data = p.data.float()  # master weights: every trainable parameter in float32
        log.info("loaded %s on %s (compute %s, weights %s): %.2fM params, %.2fM trainable", cfg.name, device,
                 compute, dtype, sum(p.numel() for p in model.parameters()) / 1e6,
                 sum(p.numel() for p in model.parameters() if p.requires_grad) / 1e6)
        policy = cls(model, tokenizer, cfg.name, device, compute)
        policy.chat_template, policy.system_prompt = cfg.chat_template, cfg.system_prompt
        return policy

    # -- precision --------------------------------------------------------------------------
    def autocast(self):
        """Matmuls in the compute dtype (a no-op for float32)."""
        return torch.autocast(self.device.type, dtype=self.compute_dtype, enabled=self.compute_dtype != torch.float32)

    def head_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Float32 logits [B, c, V] from final hidden states [B, c, H], the head in its weight's dtype.

        V is the tokenizer's size: Qwen2.5's embedding has 151,936 rows for 151,665 tokens, and an id
        in the padding rows is no token (it decodes to nothing, and every peer's codec rejects the
        packet that carries it), so those rows are cut here, for sampling and training alike.
        """
        head = self.model.get_output_embeddings()
        with torch.autocast(self.device.type, enabled=False):
            logits = head(hidden.to(head.weight.dtype)).float()  # [B, c, V_model]
        return logits[..., :self.vocab_size] if logits.shape[-1] > self.vocab_size else logits  # [B, c, V]

    # -- text <-> tokens --------------------------------------------------------------------
    @property
    def vocab_size(self) -> int:
        return len(self.tokenizer)

    def encode(self, text: str) -> list[int]:
        return encode(self.tokenizer, text)

    def decode(self, tokens) -> str:
        return decode(self.tokenizer, tokens)

    def scorer(self, task: Task) -> Scorer:
        """`task` rendered and rewarded with this policy's tokenizer and prompt settings."""
        return Scorer(task, self.tokenizer, self.chat_template, self.system_prompt)

    def trainable_parameters(self) -> list[torch.nn.Parameter]:
        return [p for p in self.model.parameters() if p.requires_grad]

    def save(self, path: str | Path) -> None:
        """Save weights (or only the LoRA adapter) and the tokenizer, loadable with `--model path`."""
        self.model.save_pretrained(str(path))
        self.tokenizer.save_pretrained(str(path))

    def left_pad(self, prompts: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
        """Left-padded token ids and attention mask on the model's device (for generation)."""
        width = max(len(p) for p in prompts)
        ids = torch.full((len(prompts), width), self.pad_id, dtype=torch.long)  # [B, P]
        mask = torch.zeros((len(prompts), width), dtype=torch.long)  # [B, P]
        for i, p in enumerate(prompts):
            ids[i, width - len(p):] = torch.tensor(p, dtype=torch.long)
            mask[i, width - len(p):] = 1
        return ids.to(self.device), mask.to(self.device)

    # -- scoring ----------------------------------------------------------------------------
    def token_logprobs(self, prompts: list[list[int]], completions: list[list[int]], temperature: float = 1.0,
                       chunk: int = 64) -> tuple[torch.Tensor, torch.Tensor]:
        """Log-probs (with grad) of each completion token given its prompt, at `temperature`:
        `logp` [B, T] and `mask` [B, T] (1 on completion tokens), T = longest completion."""
        ids, attention, prompt_len, mask = pad(prompts, completions, self.pad_id)  # [B, L], [B, L], [B], [B, T]
        return self.completion_logprobs(ids, attention, prompt_len, mask, temperature, chunk), mask.to(self.device)

    def completion_logprobs(self, ids: torch.Tensor, attention: torch.Tensor, prompt_len: torch.Tensor,
                            mask: torch.Tensor, temperature: float = 1.0, chunk: int = 64) -> torch.Tensor:
        """logp [B, T] (with grad, 0 where `mask` is 0) of the completion tokens of right-padded rows
        (batch.py's layout: ids, attention [B, L], prompt_len [B], mask [B, T]).

        The final hidden states are projected to the vocabulary `chunk` positions at a time under
        activation checkpointing, so peak memory holds [B, chunk, V] logits instead of [B, T, V].
        """
        ids, attention, prompt_len, mask = (x.to(self.device) for x in (ids, attention, prompt_len, mask))
        L, T = ids.shape[1], mask.shape[1]
        with self.autocast():
            hidden = self.model.get_decoder()(input_ids=ids, attention_mask=attention, use_cache=False).last_hidden_state  # [B, L, H]
        index = prompt_len[:, None] - 1 + torch.arange(T, device=self.device)  # [B, T] position predicting each token
        targets = ids.gather(1, (index + 1).clamp(max=L - 1))  # [B, T] the completion tokens (padding beyond)
        hidden = hidden.gather(1, index.clamp(max=L - 1)[:, :, None].expand(-1, -1, hidden.shape[-1]))  # [B, T, H]
        pieces = []
        for s in range(0, T, chunk):
            pieces.append(checkpoint(_chunk_logprobs, self.head_logits, hidden[:, s:s + chunk], targets[:, s:s + chunk],
                                     temperature, use_reentrant=False))  # [B, c]
        return torch.cat(pieces, dim=1) * mask  # [B, T]


def _chunk_logprobs(head_logits, hidden: torch.Tensor, targets: torch.Tensor, temperature: float) -> torch.Tensor:
    """log softmax(head(hidden) / temperature) at `targets`: hidden [B, c, H], targets [B, c] -> [B, c]."""
    logits = head_logits(hidden) / temperature  # [B, c, V]
    return torch.log_softmax(logits, dim=-1).gather(-1, targets[:, :, None]).squeeze(-1)  # [B, c]
