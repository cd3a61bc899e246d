#!/usr/bin/env bash
# Builds agent-worlds-base:<key> from Debian's packages alone (no image registry): a
# debootstrap --variant=minbase root of bookworm plus deploy/base-packages.txt, imported
# with `docker import`. <key> hashes this script, the package list, the suite and the
# mirror, so a tag that exists is the image these inputs make and the build is skipped;
# it is also tagged agent-worlds-base:latest, the Docker sandbox's default image.
# The image is also saved, compressed, under $WORLDCTL_DOCKER_CACHE (default
# ~/.cache/agent-worlds/docker) and loaded from there on a machine whose engine lacks it,
# so a cached folder spares a fresh machine the debootstrap. Prints the tag. Needs a
# running engine, and to build: root and debootstrap.
#   usage: deploy/build-base.sh [--key]   (--key: print the tag only, build nothing)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
suite=${WORLDCTL_BASE_SUITE:-bookworm}
mirror=${WORLDCTL_BASE_MIRROR:-http://deb.debian.org/debian}
packages=$(grep -v '^\s*#' "$here/base-packages.txt" | xargs | tr ' ' ',')
key=$(cat "$here/build-base.sh" "$here/base-packages.txt" <(echo "$suite $mirror") \
      | sha256sum | cut -c1-16)
tag="agent-worlds-base:$key"
if [ "${1:-}" = "--key" ]; then echo "$tag"; exit 0; fi
found() { docker tag "$tag" agent-worlds-base:latest; echo "$tag"; exit 0; }
if docker image inspect "$tag" >/dev/null 2>&1; then found; fi
cache=${WORLDCTL_DOCKER_CACHE:-$HOME/.cache/agent-worlds/docker}
saved="$cache/${tag/:/-}.tar.gz"
# One build at a time on this machine; whoever waited finds the image made.
mkdir -p "$cache"
exec 9>"$cache/build-base.lock"
flock 9
if docker image inspect "$tag" >/dev/null 2>&1; then found; fi
if [ -f "$saved" ] && gzip -dc "$saved" | docker load >&2; then found; fi
root=$(mktemp -d /var/tmp/agent-worlds-base.XXXXXX)
trap 'rm -rf "$root"' EXIT
debootstrap --variant=minbase --include="$packages" "$suite" "$root" "$mirror" >&2
# What an image never needs: apt's lists and caches, docs, man pages, locales but C.
rm -rf "$root"/var/lib/apt/lists/* "$root"/var/cache/apt/* "$root"/usr/share/doc/* \
       "$root"/usr/share/man/* "$root"/usr/share/info/*
find "$root"/usr/share/locale -mindepth 1 -maxdepth 1 ! -name 'C.*' -exec rm -rf {} +
printf 'deb %s %s main\n' "$mirror" "$suite" >"$root/etc/apt/sources.list"
# /var/tmp is /tmp, as in the bubblewrap sandbox: the root is read-only, /tmp a tmpfs.
rm -rf "$root/var/tmp" && ln -s ../tmp "$root/var/tmp"
tar -C "$root" -c . | docker import \
  -c 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin LANG=C.UTF-8' \
  -c 'CMD ["/bin/bash"]' - "$tag" >&2
docker save "$tag" | gzip -1 >"$saved.part" && mv "$saved.part" "$saved"
find "$cache" -maxdepth 1 -name 'agent-worlds-base-*.tar.gz' ! -name "${saved##*/}" -delete
found
