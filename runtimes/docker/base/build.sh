#!/usr/bin/env bash
# Builds polar's base root filesystem as a tarball, ready for `docker import`.
#   build.sh SUITE MIRROR OUT.tar
# MIRROR is the Debian mirror the host's apt already uses (polar/sandboxes/images.py reads it from
# /etc/apt/sources.list*), so no host name is written here. Needs root and debootstrap.
set -euo pipefail
SUITE="$1" MIRROR="$2" OUT="$3"
HERE="$(cd "$(dirname "$0")" && pwd)"
PKGS="$(grep -v '^\s*#' "$HERE/packages" | grep -v '^\s*$' | paste -sd, -)"
ROOT="$(mktemp -d "${TMPDIR:-/tmp}/polar-rootfs.XXXXXX")"
trap 'rm -rf "$ROOT"' EXIT

debootstrap --variant=minbase --include="$PKGS" "$SUITE" "$ROOT" "$MIRROR"

# The image never reaches a mirror again: drop apt's lists and caches, docs and man pages.
rm -rf "$ROOT"/var/lib/apt/lists/* "$ROOT"/var/cache/apt/*.bin "$ROOT"/var/cache/apt/archives/*.deb \
       "$ROOT"/usr/share/doc/* "$ROOT"/usr/share/man/* "$ROOT"/var/log/*.log
# Host-specific files Docker provides per container.
: > "$ROOT/etc/resolv.conf"
: > "$ROOT/etc/hostname"

tar --numeric-owner --xattrs -C "$ROOT" -cf "$OUT.partial" .
mv "$OUT.partial" "$OUT"
