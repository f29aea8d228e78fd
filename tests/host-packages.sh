#!/bin/sh
# Install the distribution packages that the users'-world tests need, on a Debian/Ubuntu host:
#
#   nftables, iproute2   tests/netns.py: network namespaces, NAT routers, partitions, loss, tc tbf
#                        (the NAT, partition-heal, wire and chaos-soak tests)
#   podman, podman-compose, runc, debootstrap
#                        tests/test_compose.py: docker/local-image.sh builds the CPU image from a
#                        debootstrapped Debian base (no image registry here) and podman-compose runs
#                        docker/docker-compose.yml
#   util-linux           unshare(1) for the full-disk test (tests/test_reliability.py)
#
# Idempotent and quiet when everything is present: it only calls apt-get for a missing command.
# `make test` runs it. It does nothing (exit 0, one line saying why) where it cannot install:
# not root, or no apt-get; the tests that need a missing package then skip with the install
# command, or fail when CI=true. To install by hand:  sudo sh tests/host-packages.sh
set -eu

# command -> the package that provides it
NEEDED="nft:nftables ip:iproute2 tc:iproute2 podman:podman podman-compose:podman-compose runc:runc
debootstrap:debootstrap unshare:util-linux"

missing=""
for pair in $NEEDED; do
    cmd=${pair%%:*}
    pkg=${pair#*:}
    command -v "$cmd" > /dev/null 2>&1 || PATH="$PATH:/usr/sbin:/sbin" command -v "$cmd" > /dev/null 2>&1 \
        || case " $missing " in *" $pkg "*) ;; *) missing="$missing $pkg" ;; esac
done
[ -z "$missing" ] && exit 0

if [ "$(id -u)" != 0 ] || ! command -v apt-get > /dev/null 2>&1; then
    echo "host-packages: not installing$missing (needs root and apt-get); the tests that use them skip," \
        "or fail under CI=true. Install with: sudo apt-get install$missing" >&2
    exit 0
fi

echo "host-packages: installing$missing ..." >&2
export DEBIAN_FRONTEND=noninteractive
log=$(mktemp)
if ! { apt-get update -q && apt-get install -y -q --no-install-recommends $missing; } > "$log" 2>&1; then
    tail -20 "$log" >&2
    rm -f "$log"
    echo "host-packages: apt-get failed (above)" >&2
    exit 1
fi
rm -f "$log"
echo "host-packages: installed$missing" >&2
