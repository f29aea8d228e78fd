#!/bin/sh
# The image's entry point: exec's `swarm-node "$@"`, with three optional helpers for docker
# compose, where the first node's address (which contains its peer id) is not known in advance:
#
#   SWARM_NODE_ADDR_FILE=FILE   once the node's OUT/status.json (OUT = its --out) lists its
#                               join addresses, write the first one into FILE, so others can join
#   SWARM_NODE_PEERS_FILE=FILE  wait until FILE is not empty, then add `--peers <its content>`
#   SWARM_NODE_ARGS="..."       more arguments, split at spaces (no quoting), e.g. "--rounds 20"
#
# Without them it is exactly `swarm-node "$@"`: the node becomes the container's main process
# (under tini), so `docker stop`'s SIGINT and its exit code need no forwarding.
set -eu

# The value of --out in the arguments ("" if absent).
out_dir() {
    while [ $# -gt 0 ]; do
        case "$1" in
            --out) echo "${2:-}"; return ;;
            --out=*) echo "${1#--out=}"; return ;;
        esac
        shift
    done
}

# Poll STATUS until this run's node (status written at or after STARTED) lists a join address,
# write it to ADDR_FILE atomically; give up when process NODE_PID is gone.
publish_address() {
    status=$1 addr_file=$2 node_pid=$3 started=$4
    while kill -0 "$node_pid" 2>/dev/null; do
        addr=$(python3 - "$status" "$started" <<'EOF' 2>/dev/null || true
import json, sys
status = json.load(open(sys.argv[1]))
if status["updated_at"] >= float(sys.argv[2]) and status["state"] != "failed" and status["join_addrs"]:
    print(status["join_addrs"][0])
EOF
)
        if [ -n "$addr" ]; then
            echo "swarm-node-entrypoint: publishing $addr in $addr_file" >&2
            printf '%s\n' "$addr" > "$addr_file.tmp"
            mv "$addr_file.tmp" "$addr_file"
            return 0
        fi
        sleep 1
    done
}

if [ -n "${SWARM_NODE_ARGS:-}" ]; then
    set -f  # split at spaces, but never expand * or ?
    # shellcheck disable=SC2086
    set -- "$@" $SWARM_NODE_ARGS
    set +f
fi

if [ -n "${SWARM_NODE_PEERS_FILE:-}" ]; then
    echo "swarm-node-entrypoint: waiting for the first node's address in $SWARM_NODE_PEERS_FILE ..." >&2
    while [ ! -s "$SWARM_NODE_PEERS_FILE" ]; do sleep 1; done
    set -- "$@" --peers "$(cat "$SWARM_NODE_PEERS_FILE")"
fi

if [ -n "${SWARM_NODE_ADDR_FILE:-}" ]; then
    out=$(out_dir "$@")
    if [ -z "$out" ]; then
        echo "swarm-node-entrypoint: SWARM_NODE_ADDR_FILE needs --out DIR (where the node writes status.json)" >&2
        exit 2
    fi
    rm -f "$SWARM_NODE_ADDR_FILE"
    # $$ is this shell, which the exec below turns into the node; the extra subshell hands the
    # publisher to PID 1 (tini), which reaps it, instead of leaving a zombie under the node.
    (publish_address "$out/status.json" "$SWARM_NODE_ADDR_FILE" "$$" "$(date +%s)" &)
fi

exec swarm-node "$@"
