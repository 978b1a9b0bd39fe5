// Connection errors in words (connect_error.hpp).
#include "kafka/connect_error.hpp"

#include <cstdio>

#include "shared/no_postgres.hpp"

namespace outbox::kafka {

namespace {

constexpr size_t kMaxTextBytes = 250; // outbox.workers.last_error holds 255
// librdkafka 2.6.1 fixed the SCRAM client-final nonce that Kafka 4.x refuses (librdkafka#4895).
constexpr int kScramFixedVersion = 0x020601ff;

bool
Contains(const std::string &s, const char *what) {
	return s.find(what) != std::string::npos;
}

// "<broker>: <what> (after 5ms in state X, 2 identical error(s) suppressed)" -> broker, what.
// The suffix changes from one retry to the next; without it the same trouble reads the same.
void
SplitReason(const std::string &reason, std::string *broker, std::string *what) {
	std::string text = reason;
	size_t after = text.rfind(" (after ");
	if (after != std::string::npos && !text.empty() && text.back() == ')') {
		text.erase(after);
	}
	size_t scheme = text.find("://");
	size_t colon = scheme == std::string::npos ? std::string::npos : text.find(": ", scheme);
	if (colon == std::string::npos) {
		broker->clear();
		*what = text;
		return;
	}
	*broker = text.substr(0, colon);
	*what = text.substr(colon + 2);
}

// The TLS alerts a broker sends when it refuses the client's certificate (mutual TLS).
bool
RefusesClientCertificate(const std::string &what) {
	for (const char *alert : {"alert bad certificate", "alert certificate required", "alert unknown ca",
	                          "alert certificate expired", "alert certificate unknown",
	                          "alert certificate revoked", "alert unsupported certificate"}) {
		if (Contains(what, alert)) {
			return true;
		}
	}
	return false;
}

} // namespace

const char *
X509ErrorText(int x509_error) {
	// The verification results (OpenSSL's X509_V_ERR_*) a broker's certificate can give; their
	// texts as X509_verify_cert_error_string() gives them, so as not to link libcrypto for this.
	switch (x509_error) {
	case 2:
		return "unable to get issuer certificate";
	case 7:
		return "certificate signature failure";
	case 9:
		return "certificate is not yet valid";
	case 10:
		return "certificate has expired";
	case 18:
		return "self-signed certificate";
	case 19:
		return "self-signed certificate in certificate chain";
	case 20:
		return "unable to get local issuer certificate";
	case 21:
		return "unable to verify the first certificate";
	case 23:
		return "certificate revoked";
	case 24:
		return "invalid CA certificate";
	case 26:
		return "unsupported certificate purpose";
	case 62:
		return "hostname mismatch";
	case 64:
		return "IP address mismatch";
	default:
		return "certificate verification failed";
	}
}

ConnectError
DescribeConnectError(ConnectErrorKind kind, const std::string &reason, int x509_error,
                     const std::string &sasl_mechanism, int librdkafka_version) {
	std::string broker, what;
	SplitReason(reason, &broker, &what);
	ConnectError out{ConnectProblem::Unreachable, ""};
	std::string hint;
	if (kind == ConnectErrorKind::Authentication) {
		out.problem = ConnectProblem::Refused;
		out.text = sasl_mechanism == "OAUTHBEARER" ? "SASL authentication failed (check sasl.oauthbearer.*): "
		                                           : "SASL authentication failed (check sasl.username/password): ";
		const std::string prefix = "SASL authentication error: "; // librdkafka's, said already
		if (what.rfind(prefix, 0) == 0) {
			what.erase(0, prefix.size());
		}
		if (sasl_mechanism.rfind("SCRAM", 0) == 0 && librdkafka_version < kScramFixedVersion) {
			hint = "; Kafka 4.x needs librdkafka >= 2.6.1 for SCRAM";
		}
	} else if (Contains(what, "certificate verify failed")) {
		// librdkafka's own hint after it ("verify that ssl.ca.location is ...") is replaced by
		// OpenSSL's verdict on the certificate: an unknown CA and an expired certificate differ.
		out.problem = ConnectProblem::Refused;
		out.text = std::string("TLS: the broker's certificate was not accepted: ") +
		           (x509_error != 0 ? X509ErrorText(x509_error) : "verification failed") +
		           " (check ssl.ca.location and the broker's certificate)";
		what.clear();
	} else if (RefusesClientCertificate(what)) {
		out.problem = ConnectProblem::Refused;
		out.text = "TLS: the broker refused the relay's certificate (check ssl.certificate.location, "
		           "ssl.key.location): ";
	} else if (kind == ConnectErrorKind::Tls || Contains(what, "SSL handshake failed") ||
	           Contains(reason, " in state SSL_HANDSHAKE")) {
		// The peer closed or garbled the handshake: a listener that speaks no TLS, or one that
		// went away. The relay never falls back to plaintext; it tries again later. librdkafka
		// 2.0.2 reports it as a TLS error; later ones (2.8.0) as a transport error, "SSL handshake
		// failed: Disconnected: ..." or a bare "Disconnected (after 1ms in state SSL_HANDSHAKE)".
		out.text = "TLS handshake failed (is the listener TLS? is security.protocol right?): ";
	}
	out.text += what;
	if (!broker.empty()) {
		out.text += " [" + broker + "]";
	}
	if (out.text.size() + hint.size() > kMaxTextBytes) {
		size_t keep = kMaxTextBytes > hint.size() + 3 ? kMaxTextBytes - hint.size() - 3 : 0;
		out.text = out.text.substr(0, keep) + "...";
	}
	out.text += hint;
	return out;
}

} // namespace outbox::kafka
