"""Commands: what a user runs. Each turns flags into a config and hands it to a lower layer.

    cli.py          `swarm-node train | join | relay | peers | eval | config | doctor | demo | plot |
                    protocol | models` (typer): one way to build a NodeConfig, one `error:` line per
                    user error
    doctor.py       `swarm-node doctor`: checks of this machine and a short real round
    peers.py        `swarm-node peers`: a light client that lists a swarm's live peers
    relay.py        `swarm-node relay`: a model-less bootstrap and circuit-relay node
    protocol.py     `swarm-node protocol`: decode/encode/validate packets, conformance vectors and
                    the live probe of a running node
    demo/           `swarm-node demo` and `plot`: a local swarm with a live view, and its figures

The top layer: may import everything below (node.py, harness/, train/, swarm/, net/, wire/,
tasks/, the base); nothing imports it but `swarm_node/__main__.py`.
"""
