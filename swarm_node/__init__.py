"""swarm-node: collaborative GRPO post-training across machines that do not trust each other.

The pipeline, one module per stage (read them in this order):

    config.py      NodeConfig: dataclasses with a doc line per field, YAML + --set overrides
    backend.py     Policy: HF causal LM (+ LoRA), sampling with log-probs, chunked token log-probs
    tasks/         arith (built-in), gsm8k, math500: examples, prompts, binary rewards
    rollout.py     prompts -> groups of G completions (tokens, generator log-probs, rewards)
    codec.py       Packet <-> canonical msgpack bytes, strict validation (protocol/SPEC.md)
    swarm.py       hivemind DHT records + P2P packet fetch (the only hivemind import)
    exchange.py    one round of sharing: offer our packet, collect peers', count rejects
    merge.py       validate peers' packets, recompute rewards, cap per peer, form groups
    loss.py        the F-TIS family as pure functions (nois/vis/tis, filtered or not)
    trainer.py     one optimizer step over the merged groups
    evaluate.py    greedy pass@1 on held-out examples
    metrics.py     one flat dict of namespaced keys per round -> metrics.jsonl
    checkpoint.py  atomic save / resume
    node.py        the round loop: generate -> exchange -> merge -> train -> eval -> log
    cli.py         `swarm-node train | join | eval | demo | plot | protocol`
"""

__version__ = "0.1.0"
