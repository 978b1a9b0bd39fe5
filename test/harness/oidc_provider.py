"""A local OpenID Connect provider for OAUTHBEARER tests: a token endpoint for the
client_credentials grant and the JWKS that a Kafka broker validates its tokens with.

    with OidcProvider(clients={"relay": "secret"}) as idp:
        idp.token_url   # http://127.0.0.1:PORT/token: POST grant_type=client_credentials,
                        # client id and secret in HTTP Basic (as librdkafka sends them)
        idp.jwks_url    # http://127.0.0.1:PORT/jwks: the public half of a throwaway RSA key

Tokens are RS256 JWTs signed with a key made at start (python3-cryptography), with sub = the
client id, iss = idp.issuer, aud = idp.audience, iat, exp and the requested scope. A wrong
client id or secret gets 401 invalid_client, whose body names neither. The server listens on
loopback only, in one daemon thread, and counts what it answered (idp.issued, idp.refused).
"""

import base64
import json
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import padding, rsa


def _b64url(data):
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _b64url_int(number):
    return _b64url(number.to_bytes((number.bit_length() + 7) // 8, "big"))


class OidcProvider:
    def __init__(self, clients, audience="kafka", token_lifetime_s=3600):
        self.clients = dict(clients)
        self.audience = audience
        self.token_lifetime_s = token_lifetime_s
        self.key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        self.kid = "outbox-test-" + _b64url(self.key.public_key().public_numbers().n.to_bytes(256, "big")[:6])
        self.issued = 0
        self.refused = 0
        self._lock = threading.Lock()
        self._server = None
        self._thread = None
        self.issuer = self.token_url = self.jwks_url = None

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()
        return False

    def start(self):
        provider = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # the test's output is not the place for requests
                pass

            def reply(self, status, body):
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):
                if self.path == "/jwks":
                    self.reply(200, provider.jwks())
                else:
                    self.reply(404, {"error": "not_found"})

            def do_POST(self):
                length = int(self.headers.get("Content-Length") or 0)
                form = urllib.parse.parse_qs(self.rfile.read(min(length, 64 * 1024)).decode("utf-8", "replace"))
                if self.path != "/token":
                    self.reply(404, {"error": "not_found"})
                elif form.get("grant_type") != ["client_credentials"]:
                    self.reply(400, {"error": "unsupported_grant_type"})
                else:
                    client = provider.authenticate(self.headers.get("Authorization") or "")
                    if client is None:
                        with provider._lock:
                            provider.refused += 1
                        self.reply(401, {"error": "invalid_client", "error_description": "client authentication failed"})
                    else:
                        scope = (form.get("scope") or [""])[0]
                        self.reply(200, {"access_token": provider.token(client, scope), "token_type": "bearer",
                                         "expires_in": provider.token_lifetime_s})

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        base = f"http://127.0.0.1:{self._server.server_address[1]}"
        self.issuer, self.token_url, self.jwks_url = base, base + "/token", base + "/jwks"
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.1},
                                        name="oidc-provider", daemon=True)
        self._thread.start()
        return self

    def stop(self):
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._thread.join(timeout=10)
            self._server = None

    def authenticate(self, authorization):
        """The client id whose HTTP Basic credentials these are, or None."""
        scheme, _, encoded = authorization.partition(" ")
        if scheme.lower() != "basic":
            return None
        try:
            client_id, _, secret = base64.b64decode(encoded, validate=True).decode().partition(":")
        except ValueError:
            return None
        client_id, secret = urllib.parse.unquote(client_id), urllib.parse.unquote(secret)
        return client_id if self.clients.get(client_id) == secret and secret else None

    def jwks(self):
        numbers = self.key.public_key().public_numbers()
        return {"keys": [{"kty": "RSA", "use": "sig", "alg": "RS256", "kid": self.kid,
                          "n": _b64url_int(numbers.n), "e": _b64url_int(numbers.e)}]}

    def token(self, client_id, scope):
        now = int(time.time())
        header = {"alg": "RS256", "typ": "JWT", "kid": self.kid}
        claims = {"sub": client_id, "iss": self.issuer, "aud": self.audience, "iat": now,
                  "exp": now + self.token_lifetime_s, "scope": scope}
        signing_input = f"{_b64url(json.dumps(header).encode())}.{_b64url(json.dumps(claims).encode())}".encode()
        signature = self.key.sign(signing_input, padding.PKCS1v15(), hashes.SHA256())
        with self._lock:
            self.issued += 1
        return f"{signing_input.decode()}.{_b64url(signature)}"
