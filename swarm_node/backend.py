"""The policy: a Hugging Face causal LM (optionally with a PEFT LoRA adapter) and its tokenizer.

Two jobs, both on whatever device the model lives on:
- `generate`: sample n completions per prompt and return, for every sampled token, its log-prob
  under the distribution it was actually drawn from (softmax(logits / temperature); no top-k /
  top-p). These are the `gen_logp` that peers receive and weigh with importance sampling.
- `token_logprobs`: log-probs of given completions under the current weights (with grad), at
  the same temperature, computed in time chunks under activation checkpointing so a
  [B, T, V] logits tensor for the whole batch never exists, neither forward nor backward.

Built-in presets (`tiny-s`, `tiny-m`, `tiny-l`) are randomly initialised Qwen2-architecture
models with a character tokenizer, so tests and the demo need no downloads. Anything else is
loaded with `from_pretrained` (a hub id or a local directory, e.g. a saved preset).
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path

import torch
from torch.utils.checkpoint import checkpoint

from swarm_node.config import ModelConfig

log = logging.getLogger(__name__)

# ----------------------------------------------------------------------------------------------
# Built-in tiny models: (hidden, layers, heads, kv_heads, mlp) of a Qwen2 architecture.

PRESETS = {
    "tiny-s": dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, intermediate_size=192),
    "tiny-m": dict(hidden_size=96, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2, intermediate_size=288),
    "tiny-l": dict(hidden_size=192, num_hidden_layers=6, num_attention_heads=6, num_key_value_heads=2, intermediate_size=576),
}
CHAR_SPECIALS = ["<|pad|>", "<|endoftext|>", "<|unk|>"]
CHAR_MARKER = "char-v1"  # saved in tokenizer_config.json so a saved preset reloads with this tokenizer
CHAR_VOCAB = CHAR_SPECIALS + ["\n", "\t"] + [chr(i) for i in range(32, 127)]


def char_tokenizer():
    """A character-level tokenizer over printable ASCII, wrapped as a transformers fast tokenizer."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    core = Tokenizer(models.WordLevel(vocab={t: i for i, t in enumerate(CHAR_VOCAB)}, unk_token="<|unk|>"))
    core.pre_tokenizer = pre_tokenizers.Split(pattern="", behavior="isolated")
    core.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=core, pad_token="<|pad|>", eos_token="<|endoftext|>",
                                   unk_token="<|unk|>", model_max_length=1024, swarm_node_tokenizer=CHAR_MARKER)


def load_tokenizer(name: str):
    """AutoTokenizer, except for a saved char tokenizer: AutoTokenizer would swap in the tokenizer
    class of the model type (Qwen2's byte-level BPE), so those load as the generic fast class."""
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    config = Path(name) / "tokenizer_config.json"
    if config.is_file() and json.loads(config.read_text()).get("swarm_node_tokenizer") == CHAR_MARKER:
        return PreTrainedTokenizerFast.from_pretrained(name)
    return AutoTokenizer.from_pretrained(name)


def preset_model(name: str, seed: int):
    """A randomly initialised Qwen2 model for preset `name` (deterministic given `seed`)."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(vocab_size=len(CHAR_VOCAB), max_position_embeddings=1024, tie_word_embeddings=True,
                         pad_token_id=0, eos_token_id=1, bos_token_id=1, **PRESETS[name])
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return Qwen2ForCausalLM(config)


# ----------------------------------------------------------------------------------------------

@dataclass
class Sample:
    """One sampled completion: token ids, their generator log-probs, and why it ended."""

    tokens: list[int]
    logprobs: list[float]
    finish_reason: str  # "stop" (EOS emitted; EOS itself is not kept) | "length"


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    if name == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return getattr(torch, name)


class Policy:
    """A causal LM + tokenizer that samples with log-probs and scores completions."""

    def __init__(self, model, tokenizer, model_id: str, device: torch.device):
        self.model, self.tokenizer, self.model_id, self.device = model, tokenizer, model_id, device
        self.eos_id = tokenizer.eos_token_id
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else self.eos_id

    @classmethod
    def load(cls, cfg: ModelConfig, adapter_path: str | Path | None = None) -> "Policy":
        """Load (or build) the model named in `cfg`, wrap it with LoRA if asked, move it to its device."""
        device = resolve_device(cfg.device)
        dtype = resolve_dtype(cfg.dtype, device)
        if cfg.name in PRESETS:
            model, tokenizer = preset_model(cfg.name, cfg.init_seed), char_tokenizer()
        else:
            from transformers import AutoModelForCausalLM

            try:
                tokenizer = load_tokenizer(cfg.name)
                model = AutoModelForCausalLM.from_pretrained(cfg.name, dtype=dtype)
            except OSError as e:
                raise ValueError(f"cannot load model {cfg.name!r}: not a preset ({', '.join(PRESETS)}), "
                                 f"a local model directory, or a reachable hub id ({e.__class__.__name__})") from None
        model.to(device=device, dtype=dtype)
        if adapter_path is not None:
            from peft import PeftModel

            model = PeftModel.from_pretrained(model, str(adapter_path), is_trainable=True)
        elif cfg.lora_r > 0:
            from peft import LoraConfig, get_peft_model

            lora = LoraConfig(r=cfg.lora_r, lora_alpha=cfg.lora_alpha or 2 * cfg.lora_r,
                              target_modules=list(cfg.lora_targets), lora_dropout=0.0, task_type="CAUSAL_LM")
            model = get_peft_model(model, lora)
        model.config.use_cache = True
        log.info("loaded %s on %s (%s): %.2fM params, %.2fM trainable", cfg.name, device, dtype,
                 sum(p.numel() for p in model.parameters()) / 1e6,
                 sum(p.numel() for p in model.parameters() if p.requires_grad) / 1e6)
        return cls(model, tokenizer, cfg.name, device)

    # -- text <-> tokens --------------------------------------------------------------------
    @property
    def vocab_size(self) -> int:
        return len(self.tokenizer)

    def encode(self, text: str) -> list[int]:
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def decode(self, tokens) -> str:
        return self.tokenizer.decode(list(tokens), skip_special_tokens=True)

    def trainable_parameters(self) -> list[torch.nn.Parameter]:
        return [p for p in self.model.parameters() if p.requires_grad]

    def save(self, path: str | Path) -> None:
        """Save weights (or only the LoRA adapter) and the tokenizer, loadable with `--model path`."""
        self.model.save_pretrained(str(path))
        self.tokenizer.save_pretrained(str(path))

    # -- sampling ---------------------------------------------------------------------------
    def _left_pad(self, prompts: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
        width = max(len(p) for p in prompts)
        ids = torch.full((len(prompts), width), self.pad_id, dtype=torch.long)  # [B, P]
        mask = torch.zeros((len(prompts), width), dtype=torch.long)  # [B, P]
        for i, p in enumerate(prompts):
            ids[i, width - len(p):] = torch.tensor(p, dtype=torch.long)
            mask[i, width - len(p):] = 1
        return ids.to(self.device), mask.to(self.device)

    @torch.no_grad()
    def generate(self, prompts: list[list[int]], n: int, max_new_tokens: int, temperature: float = 1.0,
                 greedy: bool = False, generator: torch.Generator | None = None) -> list[list[Sample]]:
        """Sample `n` completions for every prompt; returns one list of `n` Samples per prompt.

        Sampling is plain ancestral sampling from softmax(logits / temperature) (or argmax when
        `greedy`), with a KV cache; the returned log-probs are of that exact distribution.
        """
        was_training = self.model.training
        self.model.eval()
        batch = [p for p in prompts for _ in range(n)]
        ids, mask = self._left_pad(batch)  # [B, P], [B, P]
        B = ids.shape[0]
        out_tokens = torch.full((B, max_new_tokens), self.pad_id, dtype=torch.long, device=self.device)  # [B, T]
        out_logp = torch.zeros((B, max_new_tokens), dtype=torch.float32, device=self.device)  # [B, T]
        done = torch.zeros(B, dtype=torch.bool, device=self.device)  # [B]
        lengths = torch.full((B,), max_new_tokens, dtype=torch.long, device=self.device)  # [B]
        position = (mask.cumsum(-1) - 1).clamp(min=0)  # [B, P]
        past, step_ids = None, ids
        for t in range(max_new_tokens):
            out = self.model(input_ids=step_ids, attention_mask=mask, position_ids=position,
                             past_key_values=past, use_cache=True)
            past = out.past_key_values
            logits = out.logits[:, -1, :].float()  # [B, V]
            logprobs = torch.log_softmax(logits / temperature, dim=-1)  # [B, V]
            if greedy:
                token = logprobs.argmax(dim=-1)  # [B]
            else:
                token = torch.multinomial(logprobs.exp(), 1, generator=generator).squeeze(-1)  # [B]
            token = torch.where(done, torch.full_like(token, self.pad_id), token)  # [B]
            out_tokens[:, t] = token
            out_logp[:, t] = logprobs.gather(-1, token[:, None]).squeeze(-1)  # [B]
            just_ended = (token == self.eos_id) & ~done  # [B]
            lengths = torch.where(just_ended, torch.full_like(lengths, t), lengths)  # [B]
            done |= just_ended
            if bool(done.all()):
                break
            step_ids = token[:, None]  # [B, 1]
            mask = torch.cat([mask, torch.ones((B, 1), dtype=mask.dtype, device=self.device)], dim=-1)  # [B, P+t+1]
            position = position[:, -1:] + 1  # [B, 1]
        self.model.train(was_training)
        tokens, logps, lengths, done = out_tokens.tolist(), out_logp.tolist(), lengths.tolist(), done.tolist()
        samples = [Sample(tokens[i][:lengths[i]], logps[i][:lengths[i]], "stop" if done[i] else "length")
                   for i in range(B)]
        return [samples[k * n:(k + 1) * n] for k in range(len(prompts))]

    # -- scoring ----------------------------------------------------------------------------
    def token_logprobs(self, prompts: list[list[int]], completions: list[list[int]], temperature: float = 1.0,
                       chunk: int = 64) -> tuple[torch.Tensor, torch.Tensor]:
        """Log-probs (with grad) of each completion token given its prompt, at `temperature`.

        Returns `logp` [B, T] and `mask` [B, T] (1 on completion tokens), T = longest completion.
        Sequences are right-padded (prompt then completion); the final hidden states are projected
        to the vocabulary `chunk` positions at a time under activation checkpointing, so peak
        memory holds [B, chunk, V] logits instead of [B, T, V].
        """
        B = len(prompts)
        T = max(1, max(len(c) for c in completions))
        width = max(len(p) + len(c) for p, c in zip(prompts, completions))
        ids = torch.full((B, width), self.pad_id, dtype=torch.long)  # [B, L]
        attn = torch.zeros((B, width), dtype=torch.long)  # [B, L]
        targets = torch.full((B, T), self.pad_id, dtype=torch.long)  # [B, T]
        mask = torch.zeros((B, T), dtype=torch.float32)  # [B, T]
        starts = []
        for i, (p, c) in enumerate(zip(prompts, completions)):
            ids[i, :len(p) + len(c)] = torch.tensor(list(p) + list(c), dtype=torch.long)
            attn[i, :len(p) + len(c)] = 1
            targets[i, :len(c)] = torch.tensor(list(c), dtype=torch.long)
            mask[i, :len(c)] = 1.0
            starts.append(len(p) - 1)  # hidden state at position len(p)-1 predicts the first completion token
        ids, attn, targets, mask = (x.to(self.device) for x in (ids, attn, targets, mask))
        hidden = self.model.get_decoder()(input_ids=ids, attention_mask=attn).last_hidden_state  # [B, L, H]
        index = torch.tensor(starts, device=self.device)[:, None] + torch.arange(T, device=self.device)  # [B, T]
        index = index.clamp(max=width - 1)
        hidden = hidden.gather(1, index[:, :, None].expand(-1, -1, hidden.shape[-1]))  # [B, T, H]
        head = self.model.get_output_embeddings()
        pieces = []
        for s in range(0, T, chunk):
            pieces.append(checkpoint(_chunk_logprobs, head, hidden[:, s:s + chunk], targets[:, s:s + chunk],
                                     temperature, use_reentrant=False))  # [B, c]
        logp = torch.cat(pieces, dim=1) * mask  # [B, T]
        return logp, mask


def _chunk_logprobs(head: torch.nn.Module, hidden: torch.Tensor, targets: torch.Tensor,
                    temperature: float) -> torch.Tensor:
    """log softmax(head(hidden) / temperature) at `targets`: hidden [B, c, H], targets [B, c] -> [B, c]."""
    logits = head(hidden).float() / temperature  # [B, c, V]
    return torch.log_softmax(logits, dim=-1).gather(-1, targets[:, :, None]).squeeze(-1)  # [B, c]
