"""A Java consumer with the CloudEvents Java SDK (io.cloudevents:cloudevents-kafka 4.x and
kafka-clients, Maven Central), as a Java application reads the relay's CloudEvents: its
CloudEventDeserializer refuses a record whose attributes it cannot parse (a ce_source that
java.net.URI refuses, a record without ce_specversion), and such a record fails every poll.

test/cloudevents-java/build.sh builds it once into ~/.cache/outbox (OUTBOX_CACHE); this module
runs it and returns what it printed: one dict per record, its attributes and extensions as the
SDK exposes them, or {"partition", "offset", "error"} for a record the SDK refused.
"""

import json
import os
import shutil
import subprocess

_REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BUILD = os.path.join(_REPO, "test", "cloudevents-java", "build.sh")


def _built():
    res = subprocess.run([BUILD], stdout=subprocess.PIPE, text=True, timeout=1800)
    out = res.stdout.strip().splitlines()[-1] if res.stdout.strip() else ""
    if res.returncode != 0 or not os.path.isdir(out):
        raise RuntimeError(f"{BUILD} failed (exit {res.returncode}); see its messages above")
    return out


def read_with_java_sdk(bootstrap, topic, count, timeout=90):
    """The first `count` records of `topic`, read from the start by a fresh consumer group."""
    out = _built()
    java = os.path.join(os.environ["JAVA_HOME"], "bin", "java") if os.environ.get("JAVA_HOME") else shutil.which("java")
    # Under the C locale on purpose: Java 17 writes stdout in the locale's charset (a C locale
    # makes every non-ASCII character '?'), so the consumer prints ASCII only (\u escapes), and
    # running it so on every machine shows at once if that stops being true.
    res = subprocess.run([java, "-cp", f"{out}/classes:{out}/lib/*", "outbox.ReadCloudEvents", bootstrap, topic,
                          str(count), str(int(timeout * 1000))],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=timeout + 60,
                         env={**os.environ, "LC_ALL": "C", "LANG": "C"})
    # One record a line, split at "\n" only (splitlines() also splits at U+0085 or U+2028).
    lines = [json.loads(line) for line in res.stdout.split("\n") if line.startswith("{")]
    if res.returncode != 0:
        raise AssertionError(f"the Java consumer read {len(lines)} of {count} records of {topic} "
                             f"(exit {res.returncode}): {res.stderr[-3000:]}")
    return lines
