// Out-of-line half of the boundary guard (boundary.hpp): turning a caught C++ error into a
// Postgres ERROR once every C++ object is gone.
#include "shared/boundary.hpp"

namespace outbox::detail {

void
CopyCaught(CaughtError &out, const char *where, const std::exception *e) noexcept {
	out.sqlstate = ERRCODE_INTERNAL_ERROR;
	snprintf(out.message, sizeof(out.message), "%s: %s", where,
	         e ? e->what() : "unknown C++ exception");
}

void
RaiseCaught(const CaughtError &error, sigjmp_buf *saved_exception_stack) {
	// A C++ exception thrown inside a PG_TRY body leaves PG_exception_stack pointing at a dead
	// frame; restore it before raising, or the ERROR would jump into garbage.
	if (PG_exception_stack != saved_exception_stack) {
		PG_exception_stack = saved_exception_stack;
		elog(WARNING, "outbox: a C++ exception crossed a PG_TRY block; exception stack restored");
	}
	ereport(ERROR, (errcode(error.sqlstate), errmsg("%s", error.message)));
	pg_unreachable();
}

} // namespace outbox::detail
