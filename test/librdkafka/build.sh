#!/usr/bin/env bash
# Builds a current librdkafka (Debian 13's source package of 2.8.0) for Debian 12, whose own
# librdkafka 2.0.2 cannot log in to Kafka 4.x with SCRAM (fixed in 2.6.1, librdkafka#4895) and
# lacks four years of idempotence and transaction fixes. `make RDKAFKA_PREFIX=<printed prefix>`
# then links the extension against it (README "Choosing the librdkafka build").
#
# Usage: build.sh [--deps]
#   --deps   only install the build dependencies from Debian 12 (root or sudo), nothing else
#   (none)   fetch the source and build it, as any user, into
#            ${OUTBOX_CACHE:-$HOME/.cache/outbox}/librdkafka-2.8.0/prefix, and print that
#            prefix on stdout (the only stdout output; diagnostics go to stderr)
#
# The source comes with `apt-get source` from a trixie deb-src entry in a private apt
# directory under the cache: the system's sources, lists and what `apt-get install` installs
# stay as they are. apt checks the InRelease signature against the Debian archive keys of
# debian-archive-keyring and the files against the signed Sources index; the .dsc and the
# upstream tarball are also checked against the hashes pinned here. It builds with
# librdkafka's own configure and make, TLS, SASL (GSSAPI, SCRAM), OAUTHBEARER/OIDC (libcurl),
# zstd and lz4 all required.
#
# Idempotent and cached like test/kafka/fetch-jars.sh: a stamp in the prefix records what was
# built; while it matches, nothing is fetched or built. The build goes into a staging directory
# renamed into place when complete, under a lock, so an interrupted or concurrent run never
# leaves a half-built prefix.
set -euo pipefail

die() { echo "librdkafka/build.sh: error: $*" >&2; exit 1; }

version=2.8.0
debian_version=2.8.0-1
dsc_sha256=0e9f099090072fe33da42303e1878f7f4713f91b94aa6523a9d630fe67eb2b51
orig_sha256=5bd1c46f63265f31c6bfcedcde78703f77d28238eadf23821c2b43fc30be3e25
# Its Build-Depends that the library needs (debhelper, python3 only serve Debian's packaging).
build_deps=(libcurl4-openssl-dev liblz4-dev libsasl2-dev libssl-dev libzstd-dev zlib1g-dev rapidjson-dev
            pkgconf dpkg-dev gcc make)

if [[ ${1:-} == --deps ]]; then
	missing=()
	for p in "${build_deps[@]}"; do
		dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
	done
	if [[ ${#missing[@]} -gt 0 ]]; then
		sudo=""
		[[ $(id -u) -eq 0 ]] || sudo="sudo"
		echo "librdkafka/build.sh: installing ${missing[*]}" >&2
		$sudo apt-get update -qq
		DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
	fi
	exit 0
fi
[[ $# -eq 0 ]] || die "unknown argument $1 (usage: build.sh [--deps])"

cache=${OUTBOX_CACHE:-$HOME/.cache/outbox}/librdkafka-$version
prefix=$cache/prefix
stamp=$prefix/.complete
want="librdkafka $debian_version $dsc_sha256 configure --enable-ssl --enable-gssapi --enable-curl --enable-zstd --enable-lz4-ext"

mkdir -p "$cache"
# shellcheck source=../lib/cache.sh
source "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/../lib/cache.sh"
cached_or_lock "$prefix" "$want" "$cache/lock"

work="$cache/work.$$"
staging="$prefix.tmp.$$"
trap 'rm -rf "$work" "$staging"' EXIT
rm -rf "$work" "$staging"
mkdir -p "$work/apt/sources" "$work/apt/lists/partial" "$work/apt/cache/archives/partial" "$work/src"
cat >"$work/apt/sources/trixie-src.sources" <<SOURCES
Types: deb-src
URIs: http://deb.debian.org/debian
Suites: trixie
Components: main
Signed-By: /usr/share/keyrings/debian-archive-trixie-stable.gpg /usr/share/keyrings/debian-archive-trixie-automatic.gpg
SOURCES
apt_private=(-o Dir::Etc::sourcelist=/dev/null -o Dir::Etc::sourceparts="$work/apt/sources"
             -o Dir::State::Lists="$work/apt/lists" -o Dir::Cache="$work/apt/cache"
             -o Debug::NoLocking=1 -o APT::Sandbox::User="$(id -un)")

echo "librdkafka/build.sh: fetching Debian's librdkafka $debian_version source (trixie)" >&2
# apt-get update fails on a bad signature only with an error message; no Sources list is the proof.
apt-get "${apt_private[@]}" update >&2 || die "apt-get update of the trixie deb-src entry failed"
(cd "$work/src" && apt-get "${apt_private[@]}" --download-only source "librdkafka=$debian_version" >&2) ||
	die "apt-get source librdkafka=$debian_version failed"
echo "$dsc_sha256  $work/src/librdkafka_$debian_version.dsc" | sha256sum --quiet -c - >&2 ||
	die "librdkafka_$debian_version.dsc is not the one this script pins"
echo "$orig_sha256  $work/src/librdkafka_$version.orig.tar.gz" | sha256sum --quiet -c - >&2 ||
	die "librdkafka_$version.orig.tar.gz is not the one this script pins"
(cd "$work/src" && dpkg-source --no-check -x "librdkafka_$debian_version.dsc" librdkafka >&2) ||
	die "dpkg-source could not unpack librdkafka_$debian_version.dsc"

echo "librdkafka/build.sh: building librdkafka $version into $prefix" >&2
jobs=$(nproc 2>/dev/null || echo 2)
(
	cd "$work/src/librdkafka"
	./configure --prefix="$staging" --enable-ssl --enable-gssapi --enable-curl --enable-zstd --enable-lz4-ext
	make -j"$jobs" -C src
	make -C src install
) >"$work/build.log" 2>&1 || { tail -n 40 "$work/build.log" >&2; die "building librdkafka $version failed"; }

# The prefix must be where pkg-config and the extension's rpath say: rewrite the staging path.
sed -i "s|$staging|$prefix|g" "$staging/lib/pkgconfig/"*.pc
rm -f "$staging/lib/"*.a
echo "$want" >"$staging/.complete"
rm -rf "$prefix"
mv "$staging" "$prefix"
echo "$prefix"
