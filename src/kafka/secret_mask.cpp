// Secret values masked, fragments included (secret_mask.hpp).
#include "kafka/secret_mask.hpp"

#include <algorithm>

#include "shared/no_postgres.hpp"

namespace outbox::kafka {

void
SecretMask::Add(const std::string &secret) {
	if (secret.empty()) {
		return;
	}
	whole_.push_back(secret);
	for (size_t at = 0; at + kMinFragment <= secret.size(); at++) {
		fragments_.insert(secret.substr(at, kMinFragment));
	}
}

std::string
SecretMask::Apply(const std::string &text) const {
	if (whole_.empty()) {
		return text;
	}
	// Every common run of >= kMinFragment characters is covered by its kMinFragment-grams.
	std::vector<bool> masked(text.size(), false);
	for (size_t at = 0; at + kMinFragment <= text.size(); at++) {
		if (fragments_.count(text.substr(at, kMinFragment)) != 0) {
			std::fill(masked.begin() + long(at), masked.begin() + long(at + kMinFragment), true);
		}
	}
	for (const std::string &secret : whole_) {
		for (size_t at = text.find(secret); at != std::string::npos; at = text.find(secret, at + 1)) {
			std::fill(masked.begin() + long(at), masked.begin() + long(at + secret.size()), true);
		}
	}
	std::string out;
	for (size_t i = 0; i < text.size(); i++) {
		if (!masked[i]) {
			out += text[i];
		} else if (i == 0 || !masked[i - 1]) {
			out += "***";
		}
	}
	return out;
}

} // namespace outbox::kafka
