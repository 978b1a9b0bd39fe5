# outbox: transactional outbox to Apache Kafka, built with PGXS.
#
#   make && sudo make install     build outbox.so (C++17) and install it with the SQL script
#   make RDKAFKA_PREFIX=DIR      the same against the librdkafka installed under DIR
#   make installcheck             pg_regress + isolation tests on a throwaway cluster of their own
#   test/run                      everything the test command runs (docs/testing.md) (installs what is missing)

EXTENSION   = outbox
EXTVERSION  = $(shell sed -n "s/^default_version *= *'\(.*\)'/\1/p" outbox.control)
MODULE_big  = outbox
# One folder per part of the relay (src/README.md, DESIGN.md "Source layout"), the module at the top.
SRCS        = $(sort $(wildcard src/*.cpp src/*/*.cpp))
OBJS        = $(SRCS:.cpp=.o)
DATA        = $(wildcard sql/outbox--*.sql)

# pg_regress inputs live in sql/ beside the extension scripts (design card); only the names listed
# here run. The temp instance preloads the library, which `make check` cannot do for PGXS builds.
REGRESS      = setup enqueue envelope event_id admin views metrics privileges settings reserved_prefix table_checks consume upgrade ring
REGRESS_OPTS = --temp-instance=./tmp_check --temp-config=test/regress.conf
ISOLATION      = enqueue_same_event_id consume_once_concurrent
ISOLATION_OPTS = --inputdir=test --temp-instance=./tmp_check_iso --temp-config=test/regress.conf \
                 --load-extension=outbox

PG_CONFIG ?= pg_config

# PostgreSQL 14 to 18 (test/majors builds and tests each). 13 is out of support (November 2025) and
# no longer built: its branches are gone from the source.
PG_MAJOR := $(shell $(PG_CONFIG) --version | sed 's/^PostgreSQL \([0-9]*\).*/\1/')
ifeq ($(shell test $(PG_MAJOR) -ge 14 -a $(PG_MAJOR) -le 18 && echo ok),)
$(error outbox supports PostgreSQL 14 to 18; $(PG_CONFIG) reports $(PG_MAJOR) (13 is out of support since November 2025 and no longer built))
endif

# C++17 with the server's flags; -Wno-register because some server headers still use `register`.
# ERROR_ON_WARNING=1 (CI) turns warnings into errors.
PG_CXXFLAGS = -std=c++17 -Wall -Wextra -Wno-register -Wno-missing-field-initializers
# Server headers as system headers: their own warnings are not ours.
PG_CPPFLAGS = -Isrc -isystem $(shell $(PG_CONFIG) --includedir-server)
# The schema version this library's relay speaks (it waits for ALTER EXTENSION UPDATE otherwise).
PG_CPPFLAGS += -DOUTBOX_SCHEMA_VERSION='"$(EXTVERSION)"'
ifeq ($(ERROR_ON_WARNING),1)
PG_CXXFLAGS += -Werror
endif
# TEST_SEAMS=1 (the test command) compiles in the fault injection the tests use
# (outbox.test_crash_after_ack). Release builds have none of it. Switching needs `make clean`.
ifeq ($(TEST_SEAMS),1)
PG_CPPFLAGS += -DOUTBOX_TEST_SEAMS
endif
# PGXS links modules with $(CC), so the C++ runtime is named explicitly.
SHLIB_LINK  = -lrdkafka -lstdc++
# The librdkafka to build against: Debian's (/usr) by default, or the one installed under
# RDKAFKA_PREFIX (test/librdkafka/build.sh makes a current one; README "Choosing the librdkafka
# build"). Its lib directory goes into the module's rpath so that the server loads that library
# at run time, not the system's librdkafka.so.1 of the same soname.
ifneq ($(RDKAFKA_PREFIX),)
ifeq ($(wildcard $(RDKAFKA_PREFIX)/include/librdkafka/rdkafka.h),)
$(error RDKAFKA_PREFIX=$(RDKAFKA_PREFIX) has no include/librdkafka/rdkafka.h (test/librdkafka/build.sh prints a prefix that has))
endif
# As a system header, like /usr/include: its own warnings (2.8.0 has some) are not ours.
PG_CPPFLAGS := -isystem $(RDKAFKA_PREFIX)/include $(PG_CPPFLAGS)
SHLIB_LINK  := -L$(RDKAFKA_PREFIX)/lib -Wl,-rpath,$(RDKAFKA_PREFIX)/lib $(SHLIB_LINK)
endif

# Debian's server is built with LLVM JIT and would also compile every .cpp to bitcode with
# clang-14. The outbox functions are not hot in JIT-compiled expressions, so we skip bitcode:
# one compiler, no clang dependency. (Set with_llvm=yes on the command line to build it anyway.)
override with_llvm = no

# Objects of src/ at any depth, also those a build of an older layout left behind.
EXTRA_CLEAN = tmp_check tmp_check_iso output_iso results regression.diffs regression.out .deps \
              $(wildcard src/*.o src/*/*.o)

PGXS := $(shell $(PG_CONFIG) --pgxs)
include $(PGXS)

# Header edits rebuild the objects that include them (GCC dependency files).
# .deps mirrors src/'s folders (.deps/src/relay/worker.d).
DEPFLAGS = -MMD -MP -MF .deps/$*.d
%.o: %.cpp
	@mkdir -p $(dir .deps/$*)
	$(CXX) $(CXXFLAGS) $(CPPFLAGS) $(DEPFLAGS) -c -o $@ $<
-include $(wildcard .deps/src/*.d .deps/src/*/*.d)
