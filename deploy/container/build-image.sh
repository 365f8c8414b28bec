#!/bin/bash
# Build the cachepilot OCI image without a container engine's daemon:
# buildah with chroot isolation (Debian's package), over a Debian 12 base
# made with debootstrap from the archive this host's apt uses.  Writes
# out/image/cachepilot-0.1.0.oci.tar (an OCI archive: load it with
# `podman load`, `skopeo copy oci-archive:... docker-daemon:...`, or
# push it) and runs `cachepilot doctor` inside the built image.
#
#   deploy/container/build-image.sh            (as root; make image)
#
# Environment: BASE=an existing Debian 12 image (skips debootstrap),
# STORAGE_DRIVER=vfs|overlay (vfs), KEEP=1 keeps the images in buildah's
# store afterwards.
set -euo pipefail
cd "$(dirname "$0")/../.."
NAME=cachepilot
VERSION=$(sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml)
OUT=out/image
WORK=${WORK:-/var/tmp/cachepilot-image}
export STORAGE_DRIVER=${STORAGE_DRIVER:-vfs}
BUILDAH=(buildah --storage-driver "$STORAGE_DRIVER")

need() {
	command -v "$1" >/dev/null || {
		echo "build-image: $1 is missing (apt-get install $2)" >&2
		exit 1
	}
}
need buildah buildah
need skopeo skopeo
[ "$(id -u)" = 0 ] || { echo "build-image: run as root (buildah's chroot isolation)" >&2; exit 1; }
mkdir -p "$OUT" "$WORK"

# -- a Debian 12 base, from the archive this host's apt uses ----------------------
base_from_debootstrap() {
	need debootstrap debootstrap
	local mirror
	mirror=$(apt-get indextargets --format '$(REPO_URI)' 'Codename: bookworm' \
		 'Created-By: Packages' 2>/dev/null | grep -v security | head -1)
	[ -n "$mirror" ] || { echo "build-image: no bookworm archive in apt's sources" >&2; exit 1; }
	if [ ! -x "$WORK/rootfs/usr/bin/apt-get" ]; then
		echo "debootstrap bookworm from $mirror"
		rm -rf "$WORK/rootfs"
		debootstrap --variant=minbase bookworm "$WORK/rootfs" "$mirror" \
			>"$WORK/debootstrap.log" 2>&1 || {
			tail -20 "$WORK/debootstrap.log" >&2
			exit 1
		}
	fi
	# the image's apt reaches the same archives as the host's (security too)
	rm -f "$WORK/rootfs/etc/apt/sources.list"
	cp /etc/apt/sources.list.d/*.sources "$WORK/rootfs/etc/apt/sources.list.d/" 2>/dev/null ||
		cp /etc/apt/sources.list "$WORK/rootfs/etc/apt/sources.list"
	rm -rf "$WORK/rootfs/var/cache/apt/archives/"*.deb "$WORK/rootfs/var/lib/apt/lists/"*
	tar -C "$WORK/rootfs" --exclude='./dev/*' --exclude='./proc/*' --exclude='./sys/*' \
		-cf "$WORK/base.tar" .
	local ctr
	ctr=$("${BUILDAH[@]}" from scratch)
	"${BUILDAH[@]}" add "$ctr" "$WORK/base.tar" / >/dev/null
	"${BUILDAH[@]}" config --cmd /bin/bash --env PATH=/usr/sbin:/usr/bin:/sbin:/bin "$ctr"
	"${BUILDAH[@]}" commit -q "$ctr" localhost/cachepilot-base:bookworm >/dev/null
	"${BUILDAH[@]}" rm "$ctr" >/dev/null
	echo localhost/cachepilot-base:bookworm
}

BASE=${BASE:-$(base_from_debootstrap | tail -1)}
echo "base image: $BASE"

# -- the image ----------------------------------------------------------------------
"${BUILDAH[@]}" build --isolation chroot --layers=false --pull=never \
	--build-arg BASE="$BASE" -f deploy/container/Containerfile \
	-t "localhost/$NAME:$VERSION" .
archive="$OUT/$NAME-$VERSION.oci.tar"
rm -f "$archive"
"${BUILDAH[@]}" push -q "localhost/$NAME:$VERSION" "oci-archive:$archive:$NAME:$VERSION"
skopeo inspect "oci-archive:$archive" >"$OUT/$NAME-$VERSION.inspect.json"
echo "wrote $archive ($(du -h "$archive" | cut -f1))"

# -- the image runs: doctor inside it (the host's sysfs, so the sampler
# loads for real when this host can run it) -------------------------------------------
ctr=$("${BUILDAH[@]}" from --pull=never "localhost/$NAME:$VERSION")
trap '"${BUILDAH[@]}" rm "$ctr" >/dev/null 2>&1 || true' EXIT
rc=0
"${BUILDAH[@]}" run --isolation chroot -v /sys:/sys:ro "$ctr" -- cachepilot doctor || rc=$?
"${BUILDAH[@]}" run --isolation chroot "$ctr" -- cachepilot --help >/dev/null
echo "cachepilot doctor in the image: exit $rc"
if [ -z "${KEEP:-}" ]; then
	"${BUILDAH[@]}" rm "$ctr" >/dev/null
	trap - EXIT
	"${BUILDAH[@]}" rmi "localhost/$NAME:$VERSION" >/dev/null || true
fi
exit $rc
