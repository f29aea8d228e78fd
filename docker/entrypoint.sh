#!/bin/sh
# The image's entry point: runs `swarm-node "$@"`, with two optional helpers for docker compose,
# where the first node's address (which contains its peer id) is not known in advance:
#
#   SWARM_NODE_ADDR_FILE=FILE   copy the multiaddr this node prints ("Others join this swarm
#                               with:  --peers ADDR") into FILE, so others can join it
#   SWARM_NODE_PEERS_FILE=FILE  wait until FILE exists, then add `--peers <its content>`
#
# Without them it is exactly `swarm-node "$@"`.
set -eu

if [ -n "${SWARM_NODE_PEERS_FILE:-}" ]; then
    echo "waiting for the first node's address in $SWARM_NODE_PEERS_FILE ..." >&2
    while [ ! -s "$SWARM_NODE_PEERS_FILE" ]; do sleep 1; done
    set -- "$@" --peers "$(cat "$SWARM_NODE_PEERS_FILE")"
fi

if [ -z "${SWARM_NODE_ADDR_FILE:-}" ]; then
    exec swarm-node "$@"
fi

rm -f "$SWARM_NODE_ADDR_FILE"
fifo="$(mktemp -u)"
mkfifo "$fifo"
swarm-node "$@" > "$fifo" &
node=$!
trap 'kill -INT "$node" 2>/dev/null || true' INT
trap 'kill -TERM "$node" 2>/dev/null || true' TERM
while IFS= read -r line; do
    printf '%s\n' "$line"
    case "$line" in
        *"--peers /"*)
            printf '%s\n' "${line##*--peers }" > "$SWARM_NODE_ADDR_FILE.tmp"
            mv "$SWARM_NODE_ADDR_FILE.tmp" "$SWARM_NODE_ADDR_FILE" ;;
    esac
done < "$fifo"
rm -f "$fifo"
status=0
wait "$node" || status=$?
exit "$status"
