// The default CloudEvents source (cloudevent_source.hpp).
#include "shared/cloudevent_source.hpp"

#include "shared/cloudevent_attributes.hpp"
#include "shared/guc.hpp"
#include "shared/pg_include.hpp"

namespace outbox {

const char *
DefaultSource() {
	static char *derived = nullptr; // a backend serves one database for its life
	if (settings.cloudevents_source && settings.cloudevents_source[0]) {
		return settings.cloudevents_source;
	}
	if (derived == nullptr) {
		// Percent-encoded: a database name may hold a space or any other character a URI cannot.
		const char *database = get_database_name(MyDatabaseId);
		size_t len = database ? strlen(database) : 0;
		char *encoded = static_cast<char *>(palloc(cloudevents::PercentEncodedLength(database, len) + 1));
		cloudevents::PercentEncode(database, len, encoded);
		derived = MemoryContextStrdup(TopMemoryContext, psprintf("/outbox/%s", encoded));
	}
	return derived;
}

} // namespace outbox
