// The Postgres/C++ boundary. Every entry point that Postgres calls (SQL functions, the
// background worker's main, the transaction callback, shared-memory hooks, _PG_init) is an
// extern "C" function whose whole body is one call through CallFromPostgres().
//
// Rules this enforces or relies on:
//  - No C++ exception unwinds through a Postgres frame: CallFromPostgres catches everything,
//    copies the message into plain buffers, lets the C++ objects die (the catch block ends), and
//    only then raises the Postgres ERROR.
//  - No ereport(ERROR) longjmps over a live C++ object: code that calls Postgres keeps plain data
//    on its stack (palloc'd memory, PODs). Code that owns C++ objects (kafka_producer.cpp)
//    includes no Postgres header (no_postgres.hpp) and exposes noexcept functions.
//  - Never throw inside PG_TRY, never ereport inside a catch block or a destructor.
#pragma once

#include <exception>
#include <type_traits>

#include "shared/pg_include.hpp"

namespace outbox {

namespace detail {

// Plain buffers that outlive the catch block.
struct CaughtError {
	int sqlstate;
	char message[512];
};

void CopyCaught(CaughtError &out, const char *where, const std::exception *e) noexcept;
[[noreturn]] void RaiseCaught(const CaughtError &error, sigjmp_buf *saved_exception_stack);

} // namespace detail

// Call body(args...) from a Postgres frame. C++ exceptions become Postgres ERRORs.
template <typename Body, typename... Args>
auto
CallFromPostgres(const char *where, Body body, Args... args) -> decltype(body(args...)) {
	detail::CaughtError error;
	sigjmp_buf *saved_exception_stack = PG_exception_stack;
	try {
		return body(args...);
	} catch (const std::exception &e) {
		detail::CopyCaught(error, where, &e);
	} catch (...) {
		detail::CopyCaught(error, where, nullptr);
	}
	detail::RaiseCaught(error, saved_exception_stack);
}

} // namespace outbox

// Declares a SQL-callable C function `name` whose body runs behind the boundary.
//   OUTBOX_SQL_FUNCTION(outbox_uuid_v5) { ... return UUIDPGetDatum(...); }
#define OUTBOX_SQL_FUNCTION(name)                                                                  \
	static Datum name##_body(FunctionCallInfo fcinfo);                                             \
	extern "C" {                                                                                   \
	PG_FUNCTION_INFO_V1(name);                                                                     \
	Datum name(PG_FUNCTION_ARGS) {                                                                 \
		return outbox::CallFromPostgres(#name, name##_body, fcinfo);                               \
	}                                                                                              \
	}                                                                                              \
	static Datum name##_body(FunctionCallInfo fcinfo)
