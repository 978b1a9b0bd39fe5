#!/usr/bin/env bash
# Build the Java CloudEvents consumer of test/test_envelope.py (ReadCloudEvents, with the
# CloudEvents Java SDK and kafka-clients from Maven Central, versions pinned in pom.xml) into a
# cache directory, once: the same pattern as test/kafka/fetch-jars.sh.
#
# Usage: build.sh [OUT_DIR]
#   OUT_DIR defaults to ${OUTBOX_CACHE:-$HOME/.cache/outbox}/cloudevents-java-<hash>, <hash> the
#   start of a sha256 of pom.xml, the Java source and this script: a change to any rebuilds.
#   OUTBOX_MAVEN_REPO, if set, is Maven's local repository (default: Maven's own, ~/.m2).
#
# OUT_DIR holds classes/ and lib/ (the runtime jars); run it with
#   java -cp "OUT_DIR/classes:OUT_DIR/lib/*" outbox.ReadCloudEvents BOOTSTRAP TOPIC COUNT TIMEOUT_MS
# Idempotent: the build goes to a staging directory renamed into place once complete. On success
# prints the absolute OUT_DIR on stdout (its only output); diagnostics go to stderr.
set -euo pipefail

die() { echo "cloudevents-java/build.sh: error: $*" >&2; exit 1; }

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
source_file=$here/src/main/java/outbox/ReadCloudEvents.java
want=$(cat "$here/pom.xml" "$source_file" "${BASH_SOURCE[0]}" | sha256sum | cut -d' ' -f1)
out=${1:-${OUTBOX_CACHE:-$HOME/.cache/outbox}/cloudevents-java-${want:0:16}}
mkdir -p "$(dirname "$out")" || die "cannot create $(dirname "$out")"
out=$(cd "$(dirname "$out")" && pwd)/$(basename "$out")
stamp="$out/.complete"

# shellcheck source=../lib/cache.sh
source "$here/../lib/cache.sh"
cached_or_lock "$out" "$want" "$out.lock"
command -v mvn >/dev/null || die "mvn not found on PATH"
command -v javac >/dev/null || die "javac not found on PATH (a JDK 17+ is needed, not only a JRE)"

staging="$out.tmp.$$"
trap 'rm -rf "$staging"' EXIT
rm -rf "$staging"
mkdir -p "$staging/project"
# Built in a copy: no target/ in the source tree.
cp -r "$here/pom.xml" "$here/src" "$staging/project/"
mvn_args=(-q -B -f "$staging/project/pom.xml" compile dependency:copy-dependencies
          -DincludeScope=runtime -DoutputDirectory="$staging/lib")
if [[ -n ${OUTBOX_MAVEN_REPO:-} ]]; then
    mvn_args+=(-Dmaven.repo.local="$OUTBOX_MAVEN_REPO")
fi
echo "cloudevents-java/build.sh: building the Java CloudEvents consumer into $out" >&2
mvn "${mvn_args[@]}" >&2 || die "mvn failed (is Maven Central reachable? see Maven's messages above)"
mv "$staging/project/target/classes" "$staging/classes"
rm -rf "$staging/project"
[[ -f $staging/classes/outbox/ReadCloudEvents.class ]] || die "Maven finished but ReadCloudEvents.class is missing"
compgen -G "$staging/lib/cloudevents-kafka-*.jar" >/dev/null || die "Maven finished but cloudevents-kafka is missing"

echo "$want" >"$staging/.complete"
rm -rf "$out"
mv "$staging" "$out"
trap - EXIT
echo "$out"
