#!/bin/sh
# Build the CPU image swarm-node:cpu with podman on a host that reaches no image registry (no
# Docker Hub) and no download.pytorch.org, only Debian's mirror and a Python package index.
# With a registry, `docker compose -f docker/docker-compose.yml up --build` needs none of this.
#
#   1. the base image localhost/swarm-node-base:bookworm: Debian bookworm from `debootstrap`
#      (needs root and the debootstrap package; about 1 minute, 200 MB), imported with
#      `podman import`; skipped when the image exists;
#   2. swarm-node:cpu from docker/Dockerfile on that base; podman's layer cache makes a rebuild
#      after a source change take seconds.
#
#   TORCH_WHEEL=/path/torch-2.13.0+cpu-cp311-...whl docker/local-image.sh   # torch from a local wheel
#   docker/local-image.sh --base-only
#
# Environment: TORCH_WHEEL (a CPU torch wheel for Python 3.11, mounted into the build; without it
# torch comes from download.pytorch.org), PIP_INDEX_URL / PIP_EXTRA_INDEX_URL / PIP_TRUSTED_HOST
# (passed to pip in the build when set), PIP_CERT (a CA bundle file, mounted into the build for
# a TLS-intercepting proxy), DEBIAN_MIRROR (default http://deb.debian.org/debian),
# SWARM_NODE_BASE, SWARM_NODE_IMAGE (the two image names). Where podman's defaults fail (crun
# on hybrid cgroups, "setrlimit: Operation not permitted"), export
# CONTAINERS_CONF=docker/podman-containers.conf first.
# Exit codes: 0 built, 1 a step failed, 3 this host cannot build the base image (no root or no
# debootstrap): the message says which.
set -eu

PODMAN=${PODMAN:-podman}
BASE=${SWARM_NODE_BASE:-localhost/swarm-node-base:bookworm}
IMAGE=${SWARM_NODE_IMAGE:-swarm-node:cpu}
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
ROOT=$(cd "$(dirname "$0")/.." && pwd)

build_base() {
    if "$PODMAN" image exists "$BASE"; then
        echo "local-image: base image $BASE exists" >&2
        return 0
    fi
    if [ "$(id -u)" != 0 ] || ! command -v debootstrap > /dev/null; then
        echo "local-image: cannot build $BASE here: needs root and debootstrap (apt-get install debootstrap)" >&2
        exit 3
    fi
    rootfs=$(mktemp -d /var/tmp/swarm-node-rootfs.XXXXXX)
    trap 'rm -rf "$rootfs"' EXIT
    echo "local-image: debootstrap bookworm from $MIRROR into $rootfs ..." >&2
    debootstrap --variant=minbase bookworm "$rootfs" "$MIRROR" > "$rootfs.log" 2>&1 \
        || { tail -20 "$rootfs.log" >&2; rm -f "$rootfs.log"; exit 1; }
    rm -f "$rootfs.log"
    rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/*
    tar -C "$rootfs" -c . | "$PODMAN" import \
        --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
        --change 'CMD ["/bin/bash"]' - "$BASE" > /dev/null
    rm -rf "$rootfs"
    trap - EXIT
    echo "local-image: built $BASE" >&2
}

build_image() {
    set -- --build-arg TARGET=cpu --build-arg CPU_BASE="$BASE"
    for var in PIP_INDEX_URL PIP_EXTRA_INDEX_URL PIP_TRUSTED_HOST; do
        value=$(printenv "$var" || true)
        [ -n "$value" ] && set -- "$@" --build-arg "$var=$value"
    done
    if [ -n "${PIP_CERT:-}" ]; then  # a CA bundle for a TLS-intercepting proxy, as on the host
        set -- "$@" --volume "$(realpath "$PIP_CERT"):/etc/swarm-node-build-ca.pem:ro" \
            --build-arg PIP_CERT=/etc/swarm-node-build-ca.pem
    fi
    if [ -n "${TORCH_WHEEL:-}" ]; then
        wheel=$(basename "$TORCH_WHEEL")
        version=$(echo "$wheel" | cut -d- -f2)
        set -- "$@" --volume "$(dirname "$TORCH_WHEEL"):/wheels:ro" --build-arg PIP_FIND_LINKS=/wheels \
            --build-arg "TORCH_SPEC=torch==$version" \
            --build-arg "TORCH_INDEX_URL=${PIP_INDEX_URL:-https://pypi.org/simple}"
    fi
    echo "local-image: building $IMAGE ..." >&2
    old=$("$PODMAN" image inspect --format '{{.Id}}' "$IMAGE" 2> /dev/null || true)
    "$PODMAN" build -f "$ROOT/docker/Dockerfile" --ignorefile "$ROOT/docker/Dockerfile.dockerignore" "$@" \
        -t "$IMAGE" "$ROOT"
    new=$("$PODMAN" image inspect --format '{{.Id}}' "$IMAGE" 2> /dev/null || true)
    if [ -n "$old" ] && [ "$old" != "$new" ]; then  # the image it replaces: no dangling copy per rebuild
        "$PODMAN" rmi "$old" > /dev/null 2>&1 || true
    fi
}

build_base
[ "${1:-}" = "--base-only" ] || build_image
