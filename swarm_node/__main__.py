"""`python -m swarm_node ...` is the same as the `swarm-node` command."""

from swarm_node.commands.cli import app

app()
