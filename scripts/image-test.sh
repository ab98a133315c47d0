#!/usr/bin/env bash
# image-test: build the router's container image (deploy/Dockerfile) with podman, offline —
# FROM scratch, so no base image is pulled — and run `router version` and `router run --help`
# in it as its non-root user. Installs podman and runc (Debian packages) when missing.
# Idempotent; uses a podman storage of its own per checkout (never the machine's).
set -euo pipefail
cd "$(dirname "$0")/.."

IMAGE=${IMAGE:-localhost/onceflow-router:test}
GO=${GO:-go}
DOCKERFILE=${DOCKERFILE:-deploy/Dockerfile}
# One storage per checkout (several may run this at once), outside the work tree.
state=${IMAGE_STATE:-/var/tmp/onceflow-image-$(pwd -P | sha1sum | cut -c1-12)}
mkdir -p "$state"

missing=()
command -v podman >/dev/null || missing+=(podman)
command -v runc >/dev/null || missing+=(runc)
if [ ${#missing[@]} -gt 0 ]; then
  echo "image-test: installing ${missing[*]} (apt-get)"
  if [ "$(id -u)" != 0 ]; then echo "image-test: ${missing[*]} missing and this is not root: apt-get install ${missing[*]}" >&2; exit 1; fi
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
fi

# vfs works on any filesystem; cgroupfs and file events need no systemd. runc, not podman's
# default crun: crun refuses a hybrid cgroup v1/v2 mount ("cgroups in hybrid mode not
# supported"), as on VMs that mount cgroup2 beside the v1 controllers. The explicit ulimits:
# podman as root asks for nofile 1048576, which a root without CAP_SYS_RESOURCE (such VMs
# again) may not set.
podman=(podman --root "$state/storage" --runroot "$state/run" --storage-driver vfs
  --cgroup-manager cgroupfs --events-backend file --runtime runc)
limits=(--ulimit nofile=1024:1024 --ulimit nproc=1024:1024)

ctx=$(mktemp -d)
trap 'rm -rf "$ctx"' EXIT
CGO_ENABLED=0 "$GO" build -buildvcs=auto -trimpath -ldflags='-s -w' -o "$ctx/router" ./cmd/router
if file "$ctx/router" 2>/dev/null | grep -q 'dynamically linked'; then
  echo "image-test: the router binary is not static" >&2; exit 1
fi
cp /etc/ssl/certs/ca-certificates.crt "$ctx/"
echo 'onceflow:x:65532:65532:onceflow:/nonexistent:/sbin/nologin' >"$ctx/passwd"
echo 'onceflow:x:65532:' >"$ctx/group"

"${podman[@]}" build --quiet --pull=never --network=none -f "$DOCKERFILE" -t "$IMAGE" "$ctx" >/dev/null

run() { "${podman[@]}" run --rm --network=none "${limits[@]}" "$IMAGE" "$@"; }
version=$(run version)
echo "image-test: router version: $version"
want=$("$ctx/router" version)
[ "$version" = "$want" ] || { echo "image-test: the image's router version differs from the binary built: $want" >&2; exit 1; }
help=$(run run --help)
grep -q '^Usage:' <<<"$help" || { echo "image-test: router run --help printed no usage:" >&2; echo "$help" >&2; exit 1; }
user=$("${podman[@]}" image inspect --format '{{.Config.User}}' "$IMAGE")
[ "$user" = 65532:65532 ] || { echo "image-test: the image runs as '$user', not 65532:65532" >&2; exit 1; }
if out=$("${podman[@]}" run --rm --network=none "${limits[@]}" --entrypoint /bin/sh "$IMAGE" -c true 2>&1) ||
  ! grep -qi 'no such file\|not found' <<<"$out"; then
  echo "image-test: the image has a shell, or running one failed otherwise: $out" >&2; exit 1
fi
size=$("${podman[@]}" image inspect --format '{{.Size}}' "$IMAGE")
echo "IMAGE-TEST ok image=$IMAGE user=65532:65532 bytes=$size"
