"""Built-in tiny models: randomly initialised Qwen2-architecture presets with a character tokenizer.

Tests, the demo and the benchmarks use them so that nothing needs a download. A saved preset
reloads with the same tokenizer (`load_tokenizer` recognises the marker it writes).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

# (hidden, layers, heads, kv_heads, mlp) of a Qwen2 architecture.

PRESETS = {
    "tiny-s": dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, intermediate_size=192),
    "tiny-m": dict(hidden_size=96, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2, intermediate_size=288),
    # head size 32: the smallest that vLLM's CPU attention accepts (tiny-s/m/l have head size 16 or 24)
    "tiny-v": dict(hidden_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, intermediate_size=384),
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


def load_tokenizer(name: str, **kwargs):
    """AutoTokenizer, except for a saved char tokenizer: AutoTokenizer would swap in the tokenizer
    class of the model type (Qwen2's byte-level BPE), so those load as the generic fast class."""
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    config = Path(name) / "tokenizer_config.json"
    if config.is_file() and json.loads(config.read_text()).get("swarm_node_tokenizer") == CHAR_MARKER:
        return PreTrainedTokenizerFast.from_pretrained(name)
    return AutoTokenizer.from_pretrained(name, **kwargs)


def preset_model(name: str, seed: int):
    """A randomly initialised Qwen2 model for preset `name` (deterministic given `seed`)."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(vocab_size=len(CHAR_VOCAB), max_position_embeddings=1024, tie_word_embeddings=True,
                         pad_token_id=0, eos_token_id=1, bos_token_id=1, **PRESETS[name])
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return Qwen2ForCausalLM(config)
