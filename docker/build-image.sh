#!/usr/bin/env bash
# Build the LedgerMQ image where no container registry is reachable.
#
#   docker/build-image.sh [IMAGE_TAG]           (default ledgermq:latest)
#   docker/build-image.sh --audit [IMAGE_TAG]   (default ledgermq-audit:latest): the
#       image also holds Java and the `audit` extra (WITH_AUDIT=1 in the
#       Dockerfile), for the spark-master, spark-worker and audit services
#
# 1. Base image: a minimal Debian (bookworm) root file system made with
#    debootstrap from a Debian package mirror, imported with `docker import`
#    as ledgermq-base:bookworm. It holds python3 (3.11), python3-venv and the
#    tools the chaos harness runs inside containers (iproute2, iptables,
#    procps). Reused when the tag exists, so re-runs skip this slow step.
# 2. The image: docker/Dockerfile built FROM that base with host networking,
#    so pip inside the build reaches the Python package index directly.
#
# Where a registry is reachable none of this is needed:
#   docker build -f docker/Dockerfile -t ledgermq .     (FROM python:3.11-slim)
#
# Environment:
#   LEDGERMQ_BASE_IMAGE   base tag to make or reuse (ledgermq-base:bookworm)
#   DEBIAN_SUITE          Debian release for the base (bookworm: Python 3.11)
#   DEBIAN_MIRROR         package mirror (http://deb.debian.org/debian)
#   PIP_INDEX_URL         passed to the build when set (a local index/proxy)
#   LEDGERMQ_EXTRA_CA_DIR  *.crt files the base must trust besides Debian's CAs
#                         (default /usr/local/share/ca-certificates: the build
#                         host's site CAs, e.g. a TLS-inspecting egress proxy
#                         in front of the package index)
#   LEDGERMQ_REBUILD_BASE=1  make the base again even if the tag exists
#   LEDGERMQ_BUILD_LOCK   the lock file that makes builds on this host take
#                         turns (${TMPDIR:-/tmp}/ledgermq-build-image.lock)
set -euo pipefail
cd "$(dirname "$0")/.."

WITH_AUDIT=0
if [ "${1:-}" = --audit ]; then
    WITH_AUDIT=1
    shift
fi
if [ "$WITH_AUDIT" = 1 ]; then IMAGE="${1:-ledgermq-audit:latest}"; else IMAGE="${1:-ledgermq:latest}"; fi
BASE="${LEDGERMQ_BASE_IMAGE:-ledgermq-base:bookworm}"
SUITE="${DEBIAN_SUITE:-bookworm}"
MIRROR="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
# The classic builder: no BuildKit/buildx plugin is needed, and it honours
# --network host for RUN steps.
export DOCKER_BUILDKIT=0

log() { printf 'build-image: %s\n' "$*" >&2; }

# One build at a time on this host: two at once (the test suite's background
# build and a test's own, or two checkouts) would both debootstrap a missing
# base, and each would remove the image the other just tagged as "previous".
# The second waits, then finds everything in docker's layer cache.
LOCK="${LEDGERMQ_BUILD_LOCK:-${TMPDIR:-/tmp}/ledgermq-build-image.lock}"
exec 9>>"$LOCK"
if ! flock -n 9; then
    log "waiting for another build on this host (lock $LOCK)"
    flock 9
fi

make_base() {
    command -v debootstrap >/dev/null || {
        log "debootstrap is not installed (apt-get install debootstrap)"; exit 1; }
    [ "$(id -u)" = 0 ] || { log "debootstrap needs root"; exit 1; }
    local root
    root="$(mktemp -d /var/tmp/ledgermq-rootfs.XXXXXX)"
    chmod 0755 "$root"  # it becomes the image's /: mktemp made it 0700
    # Remove the half-made tree on any exit; it holds device nodes and a
    # whole OS, not something to leave behind in /var/tmp.
    trap 'rm -rf --one-file-system "$root"' EXIT
    local t0=$SECONDS
    log "debootstrap $SUITE from $MIRROR into $root (minutes on first run)"
    debootstrap --variant=minbase \
        --include=python3,python3-venv,ca-certificates,iproute2,iptables,procps \
        "$SUITE" "$root" "$MIRROR" >&2
    # Trust the site's CAs inside the image too, so pip in the build (and any
    # TLS client at run time) accepts the same certificates as this host.
    local ca_dir="${LEDGERMQ_EXTRA_CA_DIR:-/usr/local/share/ca-certificates}"
    if compgen -G "$ca_dir/*.crt" >/dev/null; then
        mkdir -p "$root/usr/local/share/ca-certificates"
        cp "$ca_dir"/*.crt "$root/usr/local/share/ca-certificates/"
        chroot "$root" update-ca-certificates >/dev/null
        log "added site CAs from $ca_dir"
    fi
    # Slim the tree: package caches, lists, docs and locales are not needed
    # at run time and every byte is copied per layer with the vfs driver.
    chroot "$root" apt-get clean
    rm -rf "$root"/var/lib/apt/lists/* "$root"/var/cache/apt/*.bin \
        "$root"/usr/share/doc/* "$root"/usr/share/man/* "$root"/usr/share/info/* \
        "$root"/usr/share/locale/* "$root"/var/log/*.log "$root"/tmp/*
    printf 'deb %s %s main\n' "$MIRROR" "$SUITE" > "$root/etc/apt/sources.list"
    tar --numeric-owner -C "$root" -c . \
        | docker import \
            --change 'ENV LANG=C.UTF-8 PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
            --change 'CMD ["/bin/bash"]' \
            --message "debootstrap --variant=minbase $SUITE" - "$BASE" >/dev/null
    rm -rf --one-file-system "$root"
    trap - EXIT
    log "base $BASE imported in $((SECONDS - t0)) s"
}

if [ "${LEDGERMQ_REBUILD_BASE:-0}" != 1 ] && docker image inspect "$BASE" >/dev/null 2>&1; then
    log "reusing base image $BASE"
else
    make_base
fi

t0=$SECONDS
# The image this tag named before; removed after a rebuild so that repeated
# builds (every source change) do not pile up untagged 400 MB images.
previous="$(docker image inspect -f '{{.Id}}' "$IMAGE" 2>/dev/null || true)"
build_args=(--build-arg "BASE_IMAGE=$BASE" --build-arg "WITH_AUDIT=$WITH_AUDIT")
[ -n "${PIP_INDEX_URL:-}" ] && build_args+=(--build-arg "PIP_INDEX_URL=$PIP_INDEX_URL")
log "docker build $IMAGE on $BASE (host network for pip)"
docker build --force-rm --network host "${build_args[@]}" -f docker/Dockerfile -t "$IMAGE" . >&2
log "image $IMAGE built in $((SECONDS - t0)) s"
current="$(docker image inspect -f '{{.Id}}' "$IMAGE")"
if [ -n "$previous" ] && [ "$previous" != "$current" ] \
        && [ "$(docker image inspect -f '{{len .RepoTags}}' "$previous" 2>/dev/null)" = 0 ]; then
    # Only when no other tag names it (removing it by id would drop that tag
    # too); fails harmlessly while a container still uses it.
    if docker image rm "$previous" >/dev/null 2>&1; then
        log "removed the previous image ${previous:7:12}"
    fi
fi
