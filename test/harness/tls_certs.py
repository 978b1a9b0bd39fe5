"""A throwaway certificate authority for TLS tests, made with openssl and keytool.

    ca = ThrowawayCa(directory)                          # CA key and certificate (PEM)
    broker = ca.issue("broker", san="DNS:localhost,IP:127.0.0.1")
    expired = ca.issue("broker-expired", san=..., expired=True)
    client = ca.issue("relay", client=True, key_password="...")   # for mutual TLS

Each issued Cert has PEM files for librdkafka (cert, key) and a PKCS12 keystore for the
Java broker; ca.truststore() is a PKCS12 truststore holding the CA for the broker's side of
mutual TLS. Nothing here is meant to be secure: keys are 2048-bit RSA made for one test run.
"""

import os
import shutil
import subprocess
from dataclasses import dataclass

STORE_PASSWORD = "test-store-password"  # of the broker's keystores and truststore


def _run(*cmd):
    res = subprocess.run(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True, timeout=120)
    if res.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed (exit {res.returncode}):\n{res.stdout}")


def _keytool():
    """keytool of the Java that runs the broker ($JAVA_HOME, else the java on PATH)."""
    java_home = os.environ.get("JAVA_HOME")
    java = os.path.join(java_home, "bin", "java") if java_home else shutil.which("java")
    candidate = os.path.join(os.path.dirname(os.path.realpath(java)), "keytool") if java else ""
    found = candidate if os.access(candidate, os.X_OK) else shutil.which("keytool")
    if not found:
        raise RuntimeError("keytool not found (it comes with the Java runtime: set JAVA_HOME)")
    return found


@dataclass
class Cert:
    name: str
    cert_pem: str      # the certificate
    key_pem: str       # its private key (encrypted with key_password when there is one)
    key_password: str  # None: the key file is not encrypted
    keystore: str      # PKCS12 (key + certificate + CA), password STORE_PASSWORD


class ThrowawayCa:
    def __init__(self, directory):
        self.dir = directory
        os.makedirs(directory, exist_ok=True)
        self.key = os.path.join(directory, "ca.key")
        self.cert_pem = os.path.join(directory, "ca.pem")
        _run("openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", self.key,
             "-out", self.cert_pem, "-days", "2", "-subj", "/CN=outbox test CA")
        self._truststore = None

    def issue(self, name, san="DNS:localhost,IP:127.0.0.1", expired=False, client=False,
              key_password=None):
        """A certificate signed by this CA. expired=True: its validity ended a day before it
        began (openssl x509 -days -1), which verifiers report as 'certificate has expired'."""
        base = os.path.join(self.dir, name)
        key, csr, cert, ext = base + ".key", base + ".csr", base + ".pem", base + ".ext"
        _run("openssl", "req", "-newkey", "rsa:2048", "-nodes", "-keyout", key, "-out", csr,
             "-subj", f"/CN={name}")
        with open(ext, "w") as f:
            f.write(f"subjectAltName={san}\n")
            f.write(f"extendedKeyUsage={'clientAuth' if client else 'serverAuth'}\n")
        _run("openssl", "x509", "-req", "-in", csr, "-CA", self.cert_pem, "-CAkey", self.key,
             "-CAcreateserial", "-days", "-1" if expired else "2", "-extfile", ext, "-out", cert)
        keystore = base + ".p12"
        _run("openssl", "pkcs12", "-export", "-in", cert, "-inkey", key, "-certfile",
             self.cert_pem, "-name", name, "-out", keystore, "-passout", f"pass:{STORE_PASSWORD}")
        if key_password is not None:
            encrypted = base + ".enc.key"
            _run("openssl", "pkcs8", "-topk8", "-in", key, "-out", encrypted, "-v2", "aes-256-cbc",
                 "-passout", f"pass:{key_password}")
            os.replace(encrypted, key)
        return Cert(name, cert, key, key_password, keystore)

    def truststore(self):
        """A PKCS12 truststore with this CA as a trusted entry (keytool: a Java truststore
        needs the trusted-certificate attribute that openssl pkcs12 does not write)."""
        if self._truststore is None:
            path = os.path.join(self.dir, "truststore.p12")
            _run(_keytool(), "-importcert", "-noprompt", "-alias", "outbox-test-ca", "-file",
                 self.cert_pem, "-keystore", path, "-storetype", "PKCS12",
                 "-storepass", STORE_PASSWORD)
            self._truststore = path
        return self._truststore
