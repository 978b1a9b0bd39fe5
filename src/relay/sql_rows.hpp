// The result set of the extension's set-returning SQL functions (materialized, per query).
#pragma once

#include "shared/pg_include.hpp"

// A materialized result set for the function's declared row type; `name` is the function's, for
// the error of a call outside a FROM clause.
Tuplestorestate *BeginRows(FunctionCallInfo fcinfo, const char *name);
