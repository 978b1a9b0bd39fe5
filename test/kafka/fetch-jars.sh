#!/usr/bin/env bash
# Fetch the Apache Kafka broker's runtime jars from Maven Central into a cache directory,
# for the single-node test broker started by test/harness/kafka_broker.py.
#
# Usage: fetch-jars.sh [LIBS_DIR]
#   LIBS_DIR defaults to ${OUTBOX_CACHE:-$HOME/.cache/outbox}/kafka-<version>/libs, where
#   <version> is the kafka.version property of pom.xml next to this script.
#   OUTBOX_KAFKA_POM, if set, is the pom to resolve instead of pom.xml next to this script
#   (pom-3.9.xml: the Kafka 3.9 broker of the SASL/SCRAM tests; pom-4.4.xml: the newest release,
#   for the end-to-end tests).
#   OUTBOX_MAVEN_REPO, if set, is used as Maven's local repository (default: Maven's own,
#   normally ~/.m2/repository).
#
# Idempotent: a stamp file in LIBS_DIR records a hash of pom.xml once the directory is
# complete; while it matches, nothing is resolved or downloaded. The jars are copied into a
# staging directory that is renamed into place only when complete, so an interrupted run
# never leaves a half-filled LIBS_DIR behind.
#
# On success prints the absolute LIBS_DIR on stdout (the only stdout output); diagnostics go
# to stderr. Exits non-zero with a message on failure.
set -euo pipefail

die() { echo "fetch-jars.sh: error: $*" >&2; exit 1; }

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
pom=${OUTBOX_KAFKA_POM:-$here/pom.xml}
[[ -f $pom ]] || die "missing $pom"

version=$(sed -n 's:.*<kafka.version>\([^<]*\)</kafka.version>.*:\1:p' "$pom" | head -n1)
[[ -n $version ]] || die "no <kafka.version> property in $pom"

libs=${1:-${OUTBOX_CACHE:-$HOME/.cache/outbox}/kafka-$version/libs}
mkdir -p "$(dirname "$libs")" || die "cannot create $(dirname "$libs")"
libs=$(cd "$(dirname "$libs")" && pwd)/$(basename "$libs")
stamp="$libs/.complete"
want=$(sha256sum "$pom" | cut -d' ' -f1)

# shellcheck source=../lib/cache.sh
source "$here/../lib/cache.sh"
cached_or_lock "$libs" "$want" "$libs.lock"

command -v mvn >/dev/null || die "mvn not found on PATH (needed to fetch Kafka $version jars)"

staging="$libs.tmp.$$"
trap 'rm -rf "$staging"' EXIT
rm -rf "$staging"
mkdir -p "$staging"

mvn_args=(-q -B -f "$pom" dependency:copy-dependencies
          -DincludeScope=runtime -DoutputDirectory="$staging")
if [[ -n ${OUTBOX_MAVEN_REPO:-} ]]; then
    mvn_args+=(-Dmaven.repo.local="$OUTBOX_MAVEN_REPO")
fi

echo "fetch-jars.sh: fetching Kafka $version broker jars into $libs" >&2
if ! mvn "${mvn_args[@]}" >&2; then
    die "mvn dependency:copy-dependencies failed for Kafka $version" \
        "(is Maven Central reachable? see Maven's messages above)"
fi

# Sanity-check the result: the broker itself and the log binding (without the binding the
# broker starts but drops every log line, fatal errors included).
for jar in "kafka_2.13-$version.jar" "kafka-clients-$version.jar"; do
    [[ -f $staging/$jar ]] || die "Maven finished but $jar is missing from the copied jars"
done
compgen -G "$staging/log4j-slf4j-impl-*.jar" >/dev/null \
    || die "Maven finished but log4j-slf4j-impl is missing from the copied jars"

echo "$want" >"$staging/.complete"
rm -rf "$libs"
mv "$staging" "$libs"
trap - EXIT
echo "fetch-jars.sh: $(find "$libs" -name '*.jar' | wc -l) jars," \
     "$(du -sh "$libs" | cut -f1) in $libs" >&2
echo "$libs"
