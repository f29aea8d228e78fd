"""swarm-node: collaborative GRPO post-training across machines that do not trust each other.

One round of one node (node.py reads top to bottom in this order):

    generate  train/rollout.py + train/sampling/   prompts (our public schedule, wire/schedule.py) -> G
                                                    completions each, generator log-probs
    score     tasks/scoring.py                      rewards from our gold answers, for every group
    offer     swarm/exchange.py -> wire/codec.py    our groups as canonical msgpack bytes -> net/
    collect   swarm/exchange.py <- net/             peers' bytes within a deadline, fair arrival
    admit     swarm/admit.py                        decode, check (the sender's schedule too), re-score,
                                                    refuse echoes
    combine   train/rollout.py                      own + admitted peer groups (vertical | horizontal)
    train     train/batch.py -> train/trainer.py    one TrainBatch of tensors -> F-TIS (train/loss.py)
    guard     train/guard.py -> swarm/admit.py      a copy learns alone from its own samples; every k rounds,
                                                    on a secret reserve of problems nothing trains on
                                                    (train/reserve.py), if peers left us measurably
                                                    behind it: back to it, only vouched peers teach
    sync      train/sampling/                       the sampler gets the new weights
    evaluate  train/evaluate.py                     greedy pass@1 on held-out examples (every k rounds)
    log       metrics.py, status.py, train/checkpoint.py

Layers, lowest first; a module imports only its own folder and the layers below it
(tests/test_layers.py checks this, function-level imports included; docs/ARCHITECTURE.md draws it):

    base       config.py (NodeConfig: dataclasses, a doc line per field), errors.py (SwarmNodeError:
               user errors), fsutil.py, logutil.py, metrics.py (every metric key), status.py
               (OUT/status.json), tracking.py (W&B / TensorBoard)
    tasks/     datasets, prompts, answer format and 0/1 rewards; Scorer = task + tokenizer
    wire/      the packet, byte for byte (protocol/SPEC.md), its JSON form, conformance, task contract,
               prompt schedule
    net/       the Transport: push discovery + libp2p streams over hivemind (the only hivemind
               importer), reachability and relays, neighbour scores, in-memory transport for tests
    train/     policy (model + tokenizer), presets and model sources, rollout, batch, loss, trainer,
               guard and its reserve, samplers (hf, vllm: the only vllm importer), evaluation, warm start, checkpoints
    swarm/     the trust boundary: exchange (bytes over a Transport) and admission (what a peer's
               packet may be) ; beside train/, neither imports the other
    node.py    the composition root: builds the parts from the config and runs the round loop
    harness/   one way to run nodes as processes (NodeProcess: start, wait on status.json, read
               metrics, ordered stop), warm starts, the network-namespace internet, and the hostile
               peer programs (adversary, poisoner): the demo, the tests and bench/ all use it
    commands/  the CLI (`swarm-node ...`), doctor, peers, relay, protocol tools, the demo

Public API: the `swarm-node` command; `swarm_node.node.run(cfg, connect=...)` with
`swarm_node.config.load_config`; the `Transport` and `Sampler` protocols (net/, train/sampling/);
the wire format in `swarm_node.wire.codec` (what a third party implements is protocol/SPEC.md).
"""

__version__ = "0.1.0"
