// Why the relay could not connect to a broker, in words for outbox.workers.last_error and the
// log: librdkafka's reason for a failed connection, classified as the broker refusing the relay
// (a setting must change: misconfigured) or the broker not being there (retry: backing off).
// Plain C++, no Postgres and no librdkafka header: kafka_producer.cpp feeds it.
#pragma once

#include <string>

#include "kafka/kafka_producer.hpp"

namespace outbox::kafka {

// What librdkafka reported (its error callback) about a connection.
enum class ConnectErrorKind {
	Authentication, // RD_KAFKA_RESP_ERR__AUTHENTICATION: the SASL login was refused
	Tls,            // RD_KAFKA_RESP_ERR__SSL: the TLS handshake failed
	Transport,      // RD_KAFKA_RESP_ERR__TRANSPORT, __RESOLVE, ...: the connection failed or closed
};

struct ConnectError {
	ConnectProblem problem;
	std::string text; // one line, at most about 250 bytes, with no secret in it
};

// `reason`: librdkafka's text ("<broker>: <what> (after N ms in state S, ...)"), its secrets
// already masked. x509_error: the OpenSSL verification result of the broker's certificate
// (0: none), from the certificate verification callback. sasl_mechanism: "" unless SASL is on.
ConnectError DescribeConnectError(ConnectErrorKind kind, const std::string &reason, int x509_error,
                                  const std::string &sasl_mechanism, int librdkafka_version);

// OpenSSL's text for the X.509 verification results a broker certificate can give.
const char *X509ErrorText(int x509_error);

} // namespace outbox::kafka
