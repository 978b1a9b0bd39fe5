// Included last by files that own C++ objects with destructors (the librdkafka wrapper). They
// must never see postgres.h: nothing in them may ereport, so nothing can
// longjmp over their objects. The compiler enforces it.
#pragma once

#ifdef POSTGRES_H
static_assert(false, "this file holds C++ objects and must not include PostgreSQL headers");
#endif
