// Masks secret property values in texts the relay passes on from librdkafka (log lines,
// connection errors, error texts). librdkafka may quote only part of a value (OAUTHBEARER:
// "Unrecognized sasl.oauthbearer.config beginning at: <the rest of it>"), so not only a whole
// secret is masked but every run of kMinFragment or more characters that occurs in one.
// Plain C++, no Postgres header.
#pragma once

#include <string>
#include <unordered_set>
#include <vector>

namespace outbox::kafka {

class SecretMask {
public:
	// Shorter fragments are not masked (they would hide ordinary words); a whole secret of any
	// length is.
	static constexpr size_t kMinFragment = 4;

	void Add(const std::string &secret);
	// `text` with every secret and every fragment of one replaced by ***.
	std::string Apply(const std::string &text) const;

private:
	std::vector<std::string> whole_;
	std::unordered_set<std::string> fragments_; // every kMinFragment-long substring of a secret
};

} // namespace outbox::kafka
