// The relay background worker: claim -> publish -> record, in a loop (DESIGN.md).
//
// This file calls Postgres everywhere and so holds no C++ object with a destructor on its stack:
// state that outlives a step is static plain data or palloc'd memory, and the Kafka producer is
// an opaque pointer behind noexcept functions (kafka_producer.hpp). An ERROR anywhere in the loop
// lands in the recovery block in RelayMain, which aborts the transaction (a claimed batch's rows
// stay pending, their locks released) and carries on after a pause: no crash loop.
#include "relay/worker.hpp"

#include <csignal>
#include <cstdio>
#include <fcntl.h>
#include <unistd.h>

#include "shared/boundary.hpp"
#include "shared/guc.hpp"
#include "kafka/kafka_producer.hpp"
#include "kafka/kafka_transactions.hpp"
#include "shared/metrics.hpp"
#include "launcher/launcher.hpp"
#include "relay/relay_sql.hpp"
#include "shared/shmem.hpp"
#include "shared/wait_events.hpp"
#include "relay/prepared_batch.hpp"
#include "relay/standby_wait.hpp"

namespace outbox {

namespace {

constexpr long kErrorPauseMs = 1000;
// SIGTERM, fast shutdown and cancel are served within 5 s (docs/settings.md, DESIGN.md): a wait inside the
// producer ends within one slice (kafka::kMetadataLookupMs at most), a batch in flight gets
// kShutdownGraceMs for its reports, and recording it and closing the producer take the rest.
constexpr long kShutdownGraceMs = 3000;
constexpr long kPublishWaitMarginMs = 5000; // beyond publish_timeout, for the last reports
// Retention runs every minute, or every tenth of outbox.retention when that is shorter (a short
// retention, as in tests, would otherwise keep rows up to a minute past it), at most once a second.
constexpr long kPurgeIntervalMs = 60000;
constexpr long kMinPurgeIntervalMs = 1000;
constexpr int kMaxPurgeBatchesPerRound = 100;
constexpr long kRepeatLogLineMs = 60000;
constexpr int kTopicMetadataBudgetMs = 2000; // per batch, all its new topics together
constexpr int kBrokerProbeBudgetMs = 2000;    // asking a broker that was down whether it is back
// A broker refusing a record batch refuses all of its events: when several events of one
// partition got such an error, each is sent again alone (DESIGN.md "Failures"), at most this many
// per batch; the rest go back to pending without an attempt.
constexpr int kMaxSoloSendsPerBatch = 100;
// The slices of the wait for a batch's reports inside librdkafka's flush: between them the
// worker checks its latch, postmaster death and interrupts, and records the acks so far.
constexpr long kFlushSliceMs = 5;

// Per-process state (this process is one relay worker). Static, not on the stack, so the
// recovery block's longjmp never skips it.
int worker_index = -1;
int worker_count = 0; // of this database's workers, fixed by the launcher for this process's life
const char *database_name = "";
WorkerSlot *slot = nullptr;
kafka::Producer *producer = nullptr;
MemoryContext batch_context = nullptr;
TableState last_table_state = TableState::Ready;
int outage_steps = 0;
TimestampTz backoff_until = 0;
// Step errors (ERRORs caught by the recovery block) in a row, for their backoff: reset by a batch
// recorded or an empty claim.
int error_steps = 0;
// The batch between its first produce and its record's commit: an ERROR meanwhile leaves its rows
// pending, and what Kafka acknowledged of it is sent again.
Outcome *batch_outcomes = nullptr;
int batch_size_in_flight = 0;
TimestampTz last_purge = 0;
// The ring's retention stuck (schema 0.4.0): when its WARNING was last logged (once a minute;
// only worker 0 keeps a database's retention, so per database), and whether one was logged since
// the ring last rotated freely.
TimestampTz last_ring_warning_at = 0;
bool ring_warned = false;
RingRetentionOutcome ring_outcome;
// Log de-duplication, so a down broker or a bad setting gives one line, not one per retry.
char last_logged[512];
TimestampTz last_logged_at = 0;
// The state shown while backing off: misconfigured when the broker refused the relay.
WorkerState backoff_state = WorkerState::BackingOff;
char last_outage_reason[256];
TimestampTz last_outage_logged_at = 0;
// outbox.delivery = exactly_once (DESIGN.md "Exactly once"). The producer was made transactional
// with this id; `recovered`: its InitTransactions ran and the batch in doubt, if any, was decided,
// so the worker may claim; `next_sequence`: the number of the next batch (Kafka's committed offset
// of the worker's group + 1).
char transactional_id[192];
bool transactions_ready = false; // the producer's InitTransactions ran (once per producer)
char producer_progress_topic[256]; // outbox.progress_topic when the producer was made
bool recovered = false;
int64 next_sequence = 0;
// exactly_once: claims of one event each still to make, after a batch whose Kafka transaction the
// broker refused for a record batch that each of its events passes alone (IsolateRefusedInTransactions).
int solo_claims_left = 0;
// A producer of an old identity while worker 0 decides its batch (RecoverOtherIdentities).
kafka::Producer *old_identity_producer = nullptr;

LaneSet
MyLanes() {
	return LaneSet{worker_index, worker_count};
}

void
LogOnce(int level, const char *message) {
	TimestampTz now = GetCurrentTimestamp();
	if (strcmp(message, last_logged) == 0 && !TimestampDifferenceExceeds(last_logged_at, now, kRepeatLogLineMs)) {
		return;
	}
	strlcpy(last_logged, message, sizeof(last_logged));
	last_logged_at = now;
	ereport(level, (errmsg("outbox relay %d: %s", worker_index, message)));
}

// One latch wait of at most `ms`.
void
SleepOnLatch(long ms) {
	int rc = WaitLatch(MyLatch, WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH, ms, WaitEventOf(WaitPoint::Idle));
	if (rc & WL_LATCH_SET) {
		ResetLatch(MyLatch);
	}
	CHECK_FOR_INTERRUPTS();
}

// Sleeps until a wake-up (an enqueue or retry committed, DROP EXTENSION), SIGHUP, SIGTERM, or
// `ms` pass. Any other latch set sleeps on: PostgreSQL's SIGALRM handler sets the latch, also for
// the statement timers this worker armed and disarmed (timeout.c leaves the alarm running), which
// made an idle worker claim every half second whatever outbox.poll_interval said.
void
WaitFor(long ms) {
	TimestampTz until = TimestampTzPlusMilliseconds(GetCurrentTimestamp(), Max(ms, 0L));
	for (long left; !TakeWakeRequest(slot) && !ConfigReloadPending && !ShutdownRequestPending &&
	                (left = TimestampDifferenceMilliseconds(GetCurrentTimestamp(), until)) > 0;) {
		SleepOnLatch(left);
	}
}

// outbox.batch_linger: a worker that took everything its claim could see claims again no sooner
// than this after that claim began, whatever commits wake it meanwhile, so that under a steady
// load the events of many commits share a batch and its relay writes (landed rows, the cursor, a
// commit), like a Kafka producer's linger.ms. A worker behind (a cut claim) does not linger; an
// idle one is woken at the first commit, so a lone event waits for nothing. Shutdown, a reload
// (which may change the linger) and postmaster death end it.
void
LingerAfterClaim(instr_time claim_start) {
	for (;;) {
		instr_time now;
		INSTR_TIME_SET_CURRENT(now);
		INSTR_TIME_SUBTRACT(now, claim_start);
		long left = settings.batch_linger_ms - long(INSTR_TIME_GET_MILLISEC(now));
		if (left <= 0 || ShutdownRequestPending || ConfigReloadPending) {
			return;
		}
		SetWorkerState(slot, WorkerState::Lingering);
		SleepOnLatch(left);
	}
}

// After an ERROR: a full pause, not cut short by the latch (every committed enqueue sets it), so
// a repeating error cannot loop faster than once a pause. Shutdown and postmaster death end it.
void
PauseAfterError() {
	TimestampTz until = TimestampTzPlusMilliseconds(GetCurrentTimestamp(), kErrorPauseMs);
	for (long left; !ShutdownRequestPending && (left = TimestampDifferenceMilliseconds(GetCurrentTimestamp(), until)) > 0;) {
		SleepOnLatch(left);
	}
}

void
DestroyProducer() {
	if (producer) {
		kafka::DestroyProducer(producer);
		producer = nullptr;
	}
}

// Hands librdkafka's buffered log and error lines to the server log, from this thread. A broker
// that stays down makes librdkafka repeat itself: at most kProducerLinesPerMinute lines a
// minute reach the log, and the rest are counted.
constexpr int kProducerLinesPerMinute = 10;
TimestampTz producer_log_window = 0;
int producer_lines_in_window = 0;
int producer_lines_suppressed = 0;

void
ForwardProducerLog() {
	char line[512];
	int level;
	while (producer && kafka::TakeLogLine(producer, line, sizeof(line), &level)) {
		TimestampTz now = GetCurrentTimestamp();
		if (TimestampDifferenceExceeds(producer_log_window, now, 60000)) {
			if (producer_lines_suppressed > 0) {
				ereport(LOG, (errmsg("outbox relay %d: %d more librdkafka log lines suppressed", worker_index,
				                     producer_lines_suppressed)));
			}
			producer_log_window = now;
			producer_lines_in_window = 0;
			producer_lines_suppressed = 0;
		}
		if (level > 4) {
			ereport(DEBUG1, (errmsg("outbox relay %d: %s", worker_index, line)));
		} else if (producer_lines_in_window++ < kProducerLinesPerMinute) {
			LogOnce(LOG, line);
		} else {
			producer_lines_suppressed++;
		}
	}
	if (producer) {
		int up = kafka::BrokerUp(producer);
		SpinLockAcquire(&slot->mutex);
		slot->broker = up < 0 ? BrokerState::Unknown : up ? BrokerState::Up : BrokerState::Down;
		SpinLockRelease(&slot->mutex);
	}
}

// Settings that the relay's correctness or liveness rests on, pinned over anything that the
// configuration, ALTER DATABASE ... SET or ALTER ROLE ... SET could give this session (a
// database owner may set those: a statement_timeout of 1 ms or a read-only default would
// otherwise wedge the relay). Applied at start and after every reload.
void
PinSessionSettings() {
	// Nothing a database user creates may be found by name in the relay's statements.
	const char *search_path = "pg_catalog, pg_temp";
	char lock_timeout[32];
	char statement_timeout[32];
	snprintf(lock_timeout, sizeof(lock_timeout), "%d", settings.lock_timeout_ms);
	snprintf(statement_timeout, sizeof(statement_timeout), "%d", settings.statement_timeout_ms);
	const char *const pins[][2] = {
	    {"search_path", search_path},
	    // Claim skips locked rows; requeue and purge wait for no one for long (a session holding
	    // outbox rows gets an ERROR in the log and the relay carries on, not a silent stall).
	    {"lock_timeout", lock_timeout},
	    {"statement_timeout", statement_timeout},
	    {"idle_in_transaction_session_timeout", "0"},
	    {"default_transaction_read_only", "off"},
	    {"default_transaction_isolation", "read committed"},
	    {"default_transaction_deferrable", "off"},
	    {"transform_null_equals", "off"},
	    {"session_replication_role", "origin"},
	    // The claim's generic plan is costed high on a large backlog, which would make LLVM JIT
	    // compile it on every execution: measured, that made the claim 6 times slower.
	    {"jit", "off"},
	    // The record's commit is durable before the next batch goes out; the claim's own barrier
	    // for what it publishes is relay_sql.cpp's FlushBeforePublish.
	    {"synchronous_commit", "on"},
	    // Every relay statement is written for an index walk. Without statistics (a burst into a
	    // table not analyzed yet) the planner could otherwise pick a full scan and a sort of the
	    // whole backlog for the claim; these keep the plan the same at 10 rows and at 10 million.
	    {"enable_seqscan", "off"},
	    {"enable_sort", "off"},
	    // The record statement is prepared for its generic plan (relay_sql.cpp); a server-wide
	    // plan_cache_mode would override that choice.
	    {"plan_cache_mode", "auto"},
	    // A database owner's exit_on_error = on would turn every recoverable ERROR into an exit.
	    {"exit_on_error", "off"},
	};
	for (const auto &pin : pins) {
		SetConfigOption(pin[0], pin[1], PGC_SUSET, PGC_S_OVERRIDE);
	}
}

// The interrupts that must end a wait inside the producer, read as plain flags (no ereport, no
// Postgres call): the producer polls this between its time slices, and the worker serves the
// interrupt once the call has returned.
bool
StopRequested() noexcept {
	return ShutdownRequestPending || QueryCancelPending || ProcDiePending || getppid() != PostmasterPid;
}

// The one place the producer's settings are read: both to make it and to see a reload change it.
bool
ExactlyOnce() {
	return settings.delivery == int(Delivery::ExactlyOnce);
}

int
TransactionTimeoutMs() {
	bool failover_wait = settings.failover_standbys != nullptr && settings.failover_standbys[0] != '\0';
	return kafka::TransactionTimeoutMs(settings.publish_timeout_ms, failover_wait ? settings.failover_wait_timeout_ms : 0);
}

// This worker's Kafka identity under exactly_once: stable across restarts of the worker and the
// server, different for every worker of every database of every cluster (a clone of the cluster
// keeps the system identifier: outbox.transactional_id_prefix tells two apart). It names the
// worker's lanes (worker i of N): a change of outbox.workers gives new identities, and the old
// ones' batches in doubt are decided first (RecoverOtherIdentities).
const char *
TransactionalId(int index, int count) {
	static char id[sizeof(transactional_id)];
	snprintf(id, sizeof(id), "%s-%llu-%u-%d-%d", settings.transactional_id_prefix,
	         (unsigned long long)GetSystemIdentifier(), unsigned(MyDatabaseId), count, index);
	return id;
}

kafka::ProducerConfig
CurrentProducerConfig() {
	return kafka::ProducerConfig{settings.bootstrap_servers,
	                             settings.kafka_properties,
	                             settings.kafka_properties_file,
	                             settings.publish_timeout_ms,
	                             settings.max_payload_bytes,
	                             settings.kafka_connections,
	                             StopRequested,
	                             ExactlyOnce() ? TransactionalId(worker_index, worker_count) : "",
	                             TransactionTimeoutMs()};
}

// The settings of the database (ALTER DATABASE ... SET, which its owner may do) and of the role
// are applied to this session at connect. The relay runs with the server's own: each of them goes
// back to its built-in default (settings that only change plans could otherwise make every claim
// time out), and the identity to the bootstrap superuser it connected as (a session_authorization
// or role would make each step start as the owner's role). Settings read at reload keep the
// value set here (source override) until the next start.
void
ResetDatabaseSettings() {
	// PinSessionSettings ran first: the search_path, isolation and read-only pins are in force
	// for the query below (a database's serializable deferrable default would make this very
	// snapshot wait for every serializable transaction of the cluster).
	StartTransactionCommand();
	SetConfigOption("session_authorization", GetUserNameFromId(BOOTSTRAP_SUPERUSERID, false), PGC_SUSET,
	                PGC_S_OVERRIDE);
	SetConfigOption("role", "none", PGC_SUSET, PGC_S_OVERRIDE);
	PushActiveSnapshot(GetTransactionSnapshot());
	if (SPI_connect() != SPI_OK_CONNECT) {
		elog(ERROR, "outbox relay: SPI_connect failed");
	}
	// Only what a database owner may set (context 'user'); the outbox.* settings stay (a
	// superuser may set them per database, and enqueue there follows them too). The value: the
	// configuration files' (postgresql.conf, ALTER SYSTEM), else the built-in default.
	int rc = SPI_execute(
	    "SELECT s.name, coalesce((SELECT f.setting FROM pg_catalog.pg_file_settings f "
	    "                         WHERE f.name OPERATOR(pg_catalog.=) s.name AND f.error IS NULL "
	    "                         ORDER BY f.seqno DESC LIMIT 1), s.boot_val) "
	    "FROM pg_catalog.pg_settings s "
	    "WHERE s.source OPERATOR(pg_catalog.=) ANY ('{database,user,database user}'::pg_catalog.text[]) "
	    "AND s.context OPERATOR(pg_catalog.=) 'user' "
	    "AND s.name OPERATOR(pg_catalog.<>) ALL ('{session_authorization,role}'::pg_catalog.text[]) "
	    "AND s.name OPERATOR(pg_catalog.!~~) 'outbox.%'",
	    true, 0);
	if (rc != SPI_OK_SELECT) {
		elog(ERROR, "outbox relay: could not read the session's settings: %s", SPI_result_code_string(rc));
	}
	for (uint64 i = 0; i < SPI_processed; i++) {
		const char *name = SPI_getvalue(SPI_tuptable->vals[i], SPI_tuptable->tupdesc, 1);
		const char *value = SPI_getvalue(SPI_tuptable->vals[i], SPI_tuptable->tupdesc, 2);
		if (value == nullptr) {
			continue;
		}
		// A value that does not take stays as it was, with a WARNING, not an exit.
		(void)set_config_option(name, value, PGC_SUSET, PGC_S_OVERRIDE, GUC_ACTION_SET, true, WARNING, false);
	}
	SPI_finish();
	PopActiveSnapshot();
	CommitTransactionCommand();
}

bool
KafkaSettingsChanged() {
	return kafka::ConfigDiffers(producer, CurrentProducerConfig());
}

// Creates the producer if there is none. On a bad setting the worker reports it, logs it once
// and waits for a reload instead of exiting.
bool
EnsureProducer() {
	if (producer) {
		return true;
	}
	char error[512];
	// The same number the PREPARE reserve keeps (prepared_reserve.cpp): outbox.max_workers, every
	// relay worker of the cluster, each with at most one batch prepared.
	if (ExactlyOnce() && max_prepared_xacts < Max(settings.max_workers, worker_count)) {
		snprintf(error, sizeof(error), "outbox.delivery = exactly_once needs max_prepared_transactions of at least "
		                               "outbox.max_workers (%d), plus what the applications prepare (it is %d)",
		         settings.max_workers, max_prepared_xacts);
		SetWorkerError(slot, WorkerState::Misconfigured, error);
		LogOnce(LOG, psprintf("misconfigured, not publishing until the server is restarted with it: %s", error));
		return false;
	}
	recovered = false;
	transactions_ready = false;
	strlcpy(producer_progress_topic, settings.progress_topic, sizeof(producer_progress_topic));
	strlcpy(transactional_id, ExactlyOnce() ? TransactionalId(worker_index, worker_count) : "",
	        sizeof(transactional_id));
	producer = kafka::CreateProducer(CurrentProducerConfig(), error, sizeof(error));
	if (producer == nullptr) {
		SetWorkerError(slot, WorkerState::Misconfigured, error);
		LogOnce(LOG, psprintf("misconfigured, not publishing until the settings are fixed and reloaded: %s", error));
		return false;
	}
	return true;
}

void
ReloadSettings() {
	ConfigReloadPending = false;
	ProcessConfigFile(PGC_SIGHUP);
	PinSessionSettings();
	// exactly_once: a new progress topic is made (and its offsets read) by a new producer's recovery.
	if (producer && (KafkaSettingsChanged() || (transactional_id[0] != '\0' &&
	                                            strcmp(producer_progress_topic, settings.progress_topic) != 0))) {
		// Between batches nothing is in flight: safe to remake the producer.
		DestroyProducer();
	}
}

long
BackoffMs(int step) {
	double ms = settings.backoff_base_ms;
	for (int i = 1; i < step && ms < settings.backoff_max_ms; i++) {
		ms *= 2;
	}
	if (ms > settings.backoff_max_ms) {
		ms = settings.backoff_max_ms;
	}
	// Full jitter in [ms/2, ms], so workers that failed together do not retry together.
	return long(ms * (0.5 + 0.5 * (double(random()) / 2147483647.0)));
}

#ifdef OUTBOX_TEST_SEAMS
// Test builds only (make TEST_SEAMS=1): the worker dies like a crash (SIGKILL), once: a marker
// file in the data directory makes it fire once; the test removes the file to arm it again.
void
CrashOnce(const char *what) {
	char path[MAXPGPATH];
	snprintf(path, sizeof(path), "%s/outbox_test_crash_fired", DataDir);
	int fd = open(path, O_CREAT | O_EXCL | O_WRONLY, 0600);
	if (fd < 0) {
		return; // fired before
	}
	close(fd);
	ereport(LOG, (errmsg("outbox relay %d: %s", worker_index, what)));
	kill(MyProcPid, SIGKILL);
}

// outbox.test_crash_after_ack: right after the broker acknowledged the named event and before
// the outcome is recorded.
void
MaybeCrashAfterAck(const Batch &batch, const Outcome *outcomes) {
	if (settings.test_crash_after_ack[0] == '\0') {
		return;
	}
	for (int i = 0; i < batch.n; i++) {
		if (outcomes[i] == Outcome::Published && strcmp(batch.events[i].event_id, settings.test_crash_after_ack) == 0) {
			CrashOnce(psprintf("test_crash_after_ack: crashing after the ack of %s", batch.events[i].event_id));
		}
	}
}

// outbox.test_crash_at: at the named point of an exactly_once batch.
void
MaybeCrashAt(const char *point) {
	if (strcmp(settings.test_crash_at, point) == 0) {
		CrashOnce(psprintf("test_crash_at: crashing at %s", point));
	}
}
#else
void
MaybeCrashAfterAck(const Batch &, const Outcome *) {
}

void
MaybeCrashAt(const char *) {
}
#endif

// A batch's acks recorded while the rest of it is still in flight: the record statement's time
// overlaps the broker's round trips instead of following them (DESIGN.md "Publish"). Recorded
// in the claim's transaction, committed with the rest: a crash or ERROR before the commit leaves
// them pending, as before.
struct EarlyRecord {
	const Batch *batch;
	const int *indices;  // producer index j is event indices[j]
	int count;
	kafka::Delivery *deliveries;
	bool *recorded;      // per event of the batch
	int n_recorded;
};

// Acks are recorded in steps of a sixteenth of the batch, and not fewer than this (a statement
// per handful of rows would cost more than it overlaps): small steps keep the part left for the
// final record, after the last report, small.
constexpr int kMinEarlyRecord = 256;

void
RecordAcksSoFar(EarlyRecord *r) {
	if (kafka::Outstanding(producer) == 0 ||
	    kafka::Acked(producer) - r->n_recorded < Max(kMinEarlyRecord, r->count / 16)) {
		return; // nothing left to overlap with, or too little to record yet
	}
	int *events = static_cast<int *>(palloc(sizeof(int) * r->count));
	int n = 0;
	for (int j = 0; j < r->count; j++) {
		int i = r->indices[j];
		const kafka::Delivery &d = kafka::Result(producer, j);
		if (!r->recorded[i] && d.reported && d.err == 0) {
			r->deliveries[i] = d;
			events[n++] = i;
		}
	}
	SetWorkerState(slot, WorkerState::Recording);
	instr_time record_start = MetricsNow();
	RecordPublished(*r->batch, events, n, r->deliveries);
	MetricsNoteEarlyRecord(record_start);
	SetWorkerState(slot, WorkerState::Publishing);
	for (int k = 0; k < n; k++) {
		r->recorded[events[k]] = true;
	}
	r->n_recorded += n;
	pfree(events);
}

// Waits, bounded, for the reports of everything the producer holds, in slices of librdkafka's
// flush (the brokers' threads send without lingering during it, and it serves the reports on
// this thread); between slices the latch and postmaster death are checked, and `early` (when
// set) records the acks so far. SIGTERM shortens the wait to kShutdownGraceMs; a cancel is
// served here (an ERROR: the abort leaves the batch pending). False when reports are missing.
bool
AwaitReports(long max_wait_ms, EarlyRecord *early) {
	TimestampTz deadline = TimestampTzPlusMilliseconds(GetCurrentTimestamp(), max_wait_ms);
	bool shutdown_seen = false;
	while (kafka::Outstanding(producer) > 0) {
		TimestampTz now = GetCurrentTimestamp();
		if (ShutdownRequestPending && !shutdown_seen) {
			shutdown_seen = true;
			TimestampTz grace = TimestampTzPlusMilliseconds(now, kShutdownGraceMs);
			if (grace < deadline) {
				deadline = grace;
			}
		}
		long remaining = TimestampDifferenceMilliseconds(now, deadline);
		if (remaining <= 0) {
			break;
		}
		if (early && !shutdown_seen) {
			RecordAcksSoFar(early);
		}
		long slice = Min(remaining, kFlushSliceMs);
		TimestampTz flush_start = GetCurrentTimestamp();
		// Inside librdkafka's flush the worker waits on the broker: pg_stat_activity says so.
		pgstat_report_wait_start(WaitEventOf(WaitPoint::Publish));
		kafka::Flush(producer, int(slice));
		pgstat_report_wait_end();
		// The rest of the slice, should the flush return early with reports still missing (a
		// producer with nothing left to send): never a busy loop.
		long rest = kafka::Outstanding(producer) > 0
		                ? slice - TimestampDifferenceMilliseconds(flush_start, GetCurrentTimestamp())
		                : 0;
		int rc = WaitLatch(MyLatch, WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH, Max(rest, 0L),
		                   WaitEventOf(WaitPoint::Publish));
		if (rc & WL_LATCH_SET) {
			ResetLatch(MyLatch);
		}
		ForwardProducerLog();
		CHECK_FOR_INTERRUPTS();
	}
	return kafka::Outstanding(producer) == 0;
}

// Hands events indices[0..count) of the batch (in id order) to the producer in one go, sends
// them and waits for their reports; deliveries[indices[j]] gets each result (not reported: not
// sent, or no report in time). When the producer refuses an event at once, later events of its
// key are not sent (they would overtake it); a stop request ends the hand-over. Waits at most
// max_wait_ms for the reports; returns false when some are missing. With `recorded`, acks are
// recorded while the rest is in flight (and marked there).
bool
SendEvents(const Batch &batch, const int *indices, int count, kafka::Delivery *deliveries, long max_wait_ms,
           bool *recorded) {
	if (!kafka::BeginBatch(producer, count)) {
		ereport(ERROR, (errcode(ERRCODE_OUT_OF_MEMORY), errmsg("out of memory for a relay batch")));
	}
	// Topic metadata first: a first look-up is a broker round trip, and made inside the produce
	// loop it would let the messages already produced linger out and leave in a request of their
	// own (a partition's share of the batch must travel in one request, DESIGN.md).
	const char **topics = static_cast<const char **>(palloc(sizeof(char *) * count));
	for (int j = 0; j < count; j++) {
		topics[j] = batch.events[indices[j]].topic;
	}
	kafka::PrepareTopics(producer, topics, count, kTopicMetadataBudgetMs);
	kafka::Message *messages = static_cast<kafka::Message *>(palloc(sizeof(kafka::Message) * count));
	for (int j = 0; j < count; j++) {
		const ClaimedEvent &e = batch.events[indices[j]];
		messages[j] = kafka::Message{e.topic,     e.key,       size_t(e.key_len), e.payload,     size_t(e.payload_len),
		                             e.headers,   e.n_headers, e.partition,       e.timestamp_ms};
	}
	// Handed over grouped by the partition (and connection) that sends them; a key's events stay
	// in order (kafka_producer.hpp).
	int *order = static_cast<int *>(palloc(sizeof(int) * count));
	(void)kafka::PlanBatch(producer, messages, count, order);
	const ClaimedEvent **stopped = static_cast<const ClaimedEvent **>(palloc0(sizeof(ClaimedEvent *) * count));
	int n_stopped = 0;
	for (int k = 0; k < count && !StopRequested(); k++) {
		int j = order[k];
		const ClaimedEvent &e = batch.events[indices[j]];
		bool behind_refused = false;
		for (int s = 0; e.key && s < n_stopped && !behind_refused; s++) {
			behind_refused = SameOrderScope(*stopped[s], e);
		}
		if (behind_refused) {
			continue;
		}
		if (kafka::Produce(producer, j, messages[j]) != 0 && e.key) {
			stopped[n_stopped++] = &e;
		}
	}
	EarlyRecord early{&batch, indices, count, deliveries, recorded, 0};
	bool complete = AwaitReports(max_wait_ms, recorded ? &early : nullptr);
	for (int j = 0; j < count; j++) {
		deliveries[indices[j]] = kafka::Result(producer, j);
	}
	return complete;
}

// Sets outcomes[i] and errors[i] from event i's delivery report. A record batch the broker
// refused is charged to the event here; IsolateRefusedBatches takes that back where the batch
// held other events too.
void
TakeResult(int i, const kafka::Delivery &d, Outcome *outcomes, const char **errors, bool *broker_trouble) {
	outcomes[i] = Outcome::Requeued;
	if (!d.reported) {
		return; // not sent (behind a refused event of its key, or stopped), or no report in time
	}
	if (d.err == 0) {
		outcomes[i] = Outcome::Published;
		return;
	}
	errors[i] = psprintf("%s: %s", kafka::ErrorName(d.err), kafka::ErrorText(d.err));
	if (d.partition_chosen && kafka::RefusesChosenPartition(d.err)) {
		// The count its partition was chosen by was stale: pending after a delay (a count looked up again
		// that still disagrees with the broker cannot make a loop), no attempt used.
		outcomes[i] = Outcome::Deferred;
		return;
	}
	switch (kafka::Classify(d.err)) {
	case kafka::ErrorClass::PerEvent:
	case kafka::ErrorClass::RecordBatch:
		outcomes[i] = Outcome::Rejected;
		break;
	case kafka::ErrorClass::UnknownPartition:
		// Failed at once, not after outbox.max_attempts: partitions exist or not by the topic's
		// configuration (docs/envelopes.md "Partitions").
		outcomes[i] = Outcome::Quarantined;
		errors[i] = psprintf("partition %d does not exist in the event's topic (%s)", int(d.partition), errors[i]);
		break;
	case kafka::ErrorClass::Purged:
		break; // another event's fatal error dropped it unsent: pending again at once
	case kafka::ErrorClass::BrokerWide:
		*broker_trouble = true;
		break;
	}
}

// A refusal that the broker made for a whole record batch.
bool
RefusedWithItsBatch(const kafka::Delivery &d) {
	return d.reported && !d.refused_at_produce && d.err != 0 &&
	       kafka::Classify(d.err) == kafka::ErrorClass::RecordBatch;
}

// Whether an earlier event of event i's key in this batch is not published: sending i now
// would let it overtake that one.
bool
BehindUnpublished(const Batch &batch, const Outcome *outcomes, int i) {
	for (int j = 0; batch.events[i].key && j < i; j++) {
		if (outcomes[j] != Outcome::Published && SameOrderScope(batch.events[j], batch.events[i])) {
			return true;
		}
	}
	return false;
}

// A producer that lost reports (they could still be appended behind the resent events) or hit
// a fatal error cannot keep its guarantees: it goes, and EnsureProducer makes a new one.
void
DropProducerIfBroken(bool reports_missing) {
	char fatal[512];
	if (producer && kafka::IsFatal(producer, fatal, sizeof(fatal))) {
		SetWorkerError(slot, WorkerState::Publishing, fatal);
		DestroyProducer();
	} else if (reports_missing) {
		DestroyProducer();
	}
}

// Kafka refuses record batches, not records: one event over the topic's max.message.bytes (or
// an unkeyed one for a compacted topic) gets every event of its partition's batch the same
// error. When several events of one partition got such an error, none is charged for it: each
// is sent again alone, in id order, and only a refusal of that solo send is charged. A key stops
// at its first unpublished event, so nothing of it overtakes an earlier one. Bounded by
// kMaxSoloSendsPerBatch and outbox.publish_timeout, and ended by a stop request: what is not
// tried goes back to pending without an attempt. (A solo send that waits past the pass's
// deadline gives up: the producer is remade, nothing of it can be appended later.)
void
IsolateRefusedBatches(const Batch &batch, Outcome *outcomes, kafka::Delivery *deliveries, const char **errors,
                      bool *broker_trouble, bool *reports_missing) {
	int n = batch.n;
	int *refused = static_cast<int *>(palloc(sizeof(int) * n));
	int n_refused = 0;
	for (int i = 0; i < n; i++) {
		if (RefusedWithItsBatch(deliveries[i])) {
			refused[n_refused++] = i;
		}
	}
	bool *suspect = static_cast<bool *>(palloc0(sizeof(bool) * n));
	bool any = false;
	for (int a = 0; a < n_refused; a++) {
		for (int b = a + 1; b < n_refused; b++) {
			const kafka::Delivery &da = deliveries[refused[a]], &db = deliveries[refused[b]];
			if (da.partition == db.partition &&
			    strcmp(batch.events[refused[a]].topic, batch.events[refused[b]].topic) == 0) {
				suspect[refused[a]] = suspect[refused[b]] = any = true;
			}
		}
	}
	if (!any) {
		return; // each refused record batch held one event: its own fault
	}
	for (int i = 0; i < n; i++) {
		if (suspect[i]) {
			outcomes[i] = Outcome::Requeued; // not charged unless refused alone
		}
	}
	// Under enable.gapless.guarantee the refusal made the producer fatal: a new one sends.
	DropProducerIfBroken(*reports_missing);
	*reports_missing = false;
	TimestampTz until = TimestampTzPlusMilliseconds(GetCurrentTimestamp(), settings.publish_timeout_ms);
	int tried = 0;
	for (int i = 0; i < n; i++) {
		if (!suspect[i] || BehindUnpublished(batch, outcomes, i)) {
			continue;
		}
		if (tried >= kMaxSoloSendsPerBatch || StopRequested() || GetCurrentTimestamp() >= until ||
		    !EnsureProducer()) {
			break;
		}
		tried++;
		long left_ms = TimestampDifferenceMilliseconds(GetCurrentTimestamp(), until);
		bool complete = SendEvents(batch, &i, 1, deliveries, left_ms + kPublishWaitMarginMs, nullptr);
		TakeResult(i, deliveries[i], outcomes, errors, broker_trouble);
		DropProducerIfBroken(!complete); // refused alone: fatal again
		if (!complete) {
			errors[i] = "no delivery report within outbox.publish_timeout";
			*broker_trouble = true;
		}
		if (outcomes[i] == Outcome::Requeued) {
			break; // the broker is in trouble, or a stop request: the rest waits for the next batch
		}
	}
}

// Sends the batch and waits, bounded, for every delivery report. Returns the outcome of each
// event; errors[i] is set for everything not published; recorded[i] marks the published events
// recorded already.
//
// `transactional` (exactly_once): nothing is recorded early (the record is prepared only once the
// batch may commit in Kafka) and refused record batches are not isolated here (a solo send needs
// a transaction of its own: IsolateRefusedInTransactions). Returns false when reports are missing.
bool
Publish(const Batch &batch, Outcome *outcomes, kafka::Delivery *deliveries, const char **errors, bool *recorded,
        bool *broker_trouble, bool transactional) {
	int n = batch.n;
	// Quarantined rows are never sent, and their key's later events in the batch are not sent
	// either (they would overtake a row that is about to be failed): those go back untouched.
	int *to_send = static_cast<int *>(palloc(sizeof(int) * n));
	int n_send = 0;
	const ClaimedEvent **quarantined = static_cast<const ClaimedEvent **>(palloc0(sizeof(ClaimedEvent *) * n));
	int n_quarantined = 0;
	for (int i = 0; i < n; i++) {
		const ClaimedEvent &e = batch.events[i];
		deliveries[i] = kafka::Delivery{};
		errors[i] = nullptr;
		outcomes[i] = Outcome::Requeued;
		bool behind_quarantined = false;
		for (int k = 0; e.key && k < n_quarantined && !behind_quarantined; k++) {
			behind_quarantined = SameOrderScope(*quarantined[k], e);
		}
		if (e.quarantine) {
			outcomes[i] = Outcome::Quarantined;
			errors[i] = e.quarantine;
			if (e.key) {
				quarantined[n_quarantined++] = &e;
			}
		} else if (!behind_quarantined) {
			to_send[n_send++] = i;
		}
	}
	bool reports_missing = !SendEvents(batch, to_send, n_send, deliveries,
	                                   settings.publish_timeout_ms + kPublishWaitMarginMs,
	                                   transactional ? nullptr : recorded);
	bool complete = !reports_missing;
	for (int j = 0; j < n_send; j++) {
		TakeResult(to_send[j], deliveries[to_send[j]], outcomes, errors, broker_trouble);
	}
	if (reports_missing) {
		*broker_trouble = true;
		for (int i = 0; i < n; i++) {
			if (!deliveries[i].reported && outcomes[i] == Outcome::Requeued) {
				errors[i] = "no delivery report within outbox.publish_timeout";
			}
		}
	}
	if (!transactional) {
		IsolateRefusedBatches(batch, outcomes, deliveries, errors, broker_trouble, &reports_missing);
	}

	// Broker-wide trouble only if nothing got through. When some events were appended and
	// others timed out, their partitions (or topics) are the trouble: those events wait a while
	// without using up attempts, and the worker goes on with every other key at full speed.
	int published = 0;
	for (int i = 0; i < n; i++) {
		published += outcomes[i] == Outcome::Published;
	}
	if (*broker_trouble && published > 0) {
		*broker_trouble = false;
		for (int i = 0; i < n; i++) {
			if (outcomes[i] == Outcome::Requeued && errors[i] != nullptr &&
			    (!deliveries[i].reported || kafka::Classify(deliveries[i].err) == kafka::ErrorClass::BrokerWide)) {
				outcomes[i] = Outcome::Deferred;
			}
		}
	}

	// Every event of a key after one that was not published must not have been published
	// either (gapless idempotent producer, the refused-key rule and the solo sends' key rule).
	// Say so loudly if the client ever breaks that, rather than pretend.
	int overtaken = 0;
	for (int i = 0; i < n; i++) {
		if (outcomes[i] != Outcome::Published && batch.events[i].key) {
			for (int j = i + 1; j < n; j++) {
				overtaken += outcomes[j] == Outcome::Published && SameOrderScope(batch.events[i], batch.events[j]);
			}
		}
	}
	if (overtaken > 0) {
		ereport(WARNING, (errmsg("outbox relay %d: %d events were appended after an earlier event of their topic "
		                         "and key that was not",
		                         worker_index, overtaken),
		                  errdetail("The earlier events will follow them on the partition.")));
	}
	// Late reports, or a producer that can no longer keep its guarantees: start afresh so nothing
	// from this batch can still be appended behind the resent events.
	DropProducerIfBroken(reports_missing);
	return complete;
}

// Broker-wide trouble: back off the whole worker; no event used up an attempt. `refused`: the
// broker answered and refused the relay (its login, a certificate); the worker shows
// misconfigured, and still retries with backoff, so a fix on the broker's side (a renewed
// certificate, a user created) is taken up without a reload. One log line at the outage's
// first step and whenever the step count doubles, or the reason's cause changes, or a minute passed:
// a few lines per outage however short outbox.backoff_max is, not one per retry.
// A reason's cause: the text before its first ": " (DescribeConnectError's class, e.g. "TLS
// handshake failed (...)"), whose detail librdkafka words differently from one try to the next.
bool
SameCause(const char *a, const char *b) {
	const char *end_a = strstr(a, ": ");
	const char *end_b = strstr(b, ": ");
	size_t len_a = end_a ? size_t(end_a - a) : strlen(a);
	size_t len_b = end_b ? size_t(end_b - b) : strlen(b);
	return len_a == len_b && strncmp(a, b, len_a) == 0;
}

void
NoteBrokerTrouble(const char *why, bool refused = false) {
	outage_steps++;
	long delay = BackoffMs(outage_steps);
	TimestampTz now = GetCurrentTimestamp();
	backoff_until = TimestampTzPlusMilliseconds(now, delay);
	MetricsNoteBackoff(slot, backoff_until);
	backoff_state = refused ? WorkerState::Misconfigured : WorkerState::BackingOff;
	bool doubled = (outage_steps & (outage_steps - 1)) == 0;
	if (doubled || !SameCause(why, last_outage_reason) ||
	    TimestampDifferenceExceeds(last_outage_logged_at, now, kRepeatLogLineMs)) {
		strlcpy(last_outage_reason, why, sizeof(last_outage_reason));
		last_outage_logged_at = now;
		if (refused) {
			ereport(LOG, (errmsg("outbox relay %d: not publishing, Kafka refused the connection: %s; retrying in "
			                     "%ld ms",
			                     worker_index, why, delay)));
		} else {
			ereport(LOG, (errmsg("outbox relay %d: Kafka unavailable (%s); retrying in %ld ms", worker_index, why,
			                     delay)));
		}
	}
}

// No broker answered the probe: last_error says why, from the last failed connection.
void
NoteNoBrokerReachable() {
	char why[256];
	kafka::ConnectProblem problem = kafka::LastConnectProblem(producer, why, sizeof(why));
	if (problem == kafka::ConnectProblem::None) {
		strlcpy(why, "no broker reachable", sizeof(why));
	}
	bool refused = problem == kafka::ConnectProblem::Refused;
	SetWorkerError(slot, refused ? WorkerState::Misconfigured : WorkerState::BackingOff, why);
	NoteBrokerTrouble(why, refused);
}

// What a batch's outcomes come to, once recorded: the counts, last_error, and broker trouble.
void
NoteBatchRecorded(const Batch &batch, const Outcome *outcomes, const char *const *errors, int failed,
                  bool broker_trouble) {
	uint64 published = 0;
	const char *first_error = nullptr;
	for (int i = 0; i < batch.n; i++) {
		if (outcomes[i] == Outcome::Published) {
			published++;
		} else if (!first_error && errors[i]) {
			first_error = errors[i];
		}
	}
	TimestampTz now = GetCurrentTimestamp();
	SpinLockAcquire(&slot->mutex);
	slot->published += published;
	slot->failed += uint64(failed);
	if (published > 0) {
		slot->last_publish_at = now;
	}
	SpinLockRelease(&slot->mutex);
	if (first_error) {
		SetWorkerError(slot, WorkerState::Publishing, first_error);
	}

	if (broker_trouble) {
		NoteBrokerTrouble(first_error ? first_error : "unknown");
	} else if (published > 0) {
		outage_steps = 0;
	}
}

// Events of a partition that timed out while others were acked wait a few publish timeouts,
// so that batches of healthy keys do not keep waiting for them.
long
DeferMs() {
	return BackoffMs(1) + 4L * settings.publish_timeout_ms;
}

void
RunBatch(const Batch &batch) {
	int n = batch.n;
	Outcome *outcomes = static_cast<Outcome *>(palloc0(sizeof(Outcome) * n));
	kafka::Delivery *deliveries = static_cast<kafka::Delivery *>(palloc(sizeof(kafka::Delivery) * n));
	const char **errors = static_cast<const char **>(palloc0(sizeof(char *) * n));
	bool *recorded = static_cast<bool *>(palloc0(sizeof(bool) * n));
	bool broker_trouble = false;

	SetWorkerState(slot, WorkerState::Publishing);
	pgstat_report_activity(STATE_RUNNING, "outbox relay: publish");
	// From here until RecordOutcomes commits, the claim's transaction holds the rows' locks; an
	// ERROR aborts it and leaves them pending.
	instr_time publish_start = MetricsNow();
	batch_outcomes = outcomes;
	batch_size_in_flight = n;
	Publish(batch, outcomes, deliveries, errors, recorded, &broker_trouble, false);
	MetricsNotePublish(slot, publish_start);
	MaybeCrashAfterAck(batch, outcomes);

	SetWorkerState(slot, WorkerState::Recording);
	// The record waits for no lock: the claim's transaction holds the rows and the table's lock.
	instr_time record_start = MetricsNow();
	int failed = RecordOutcomes(batch, outcomes, deliveries, errors, DeferMs(), recorded);
	batch_outcomes = nullptr;
	error_steps = 0;
	MetricsNoteBatch(slot, batch, outcomes, failed, record_start);
	NoteBatchRecorded(batch, outcomes, errors, failed, broker_trouble);
}

// ---- outbox.delivery = exactly_once (DESIGN.md "Exactly once") ----

bool
Transactional() {
	return producer != nullptr && transactional_id[0] != '\0';
}

// A Kafka call's budget: what a batch may take in flight.
int
TransactionBudgetMs() {
	return settings.publish_timeout_ms;
}

// Aborts the batch's Kafka transaction; when that cannot be done the producer goes, and the next
// one's InitTransactions aborts what it left open. Either way read_committed consumers never see
// the transaction's records.
void
AbortKafkaTransaction() {
	char why[256];
	if (producer && kafka::AbortTransaction(producer, TransactionBudgetMs(), why, sizeof(why)) != kafka::TxnResult::Done) {
		LogOnce(LOG, psprintf("could not abort a Kafka transaction (%s); the producer is made anew, which aborts it",
		                      why));
		DestroyProducer();
	}
}

// A Kafka transaction fails as a whole: an event the broker refused, or a report missing, makes
// it abortable. (An event the producer refused at once never entered it.)
bool
KafkaTransactionFailed(const Batch &batch, const kafka::Delivery *deliveries, bool complete) {
	if (!complete || producer == nullptr) {
		return true;
	}
	for (int i = 0; i < batch.n; i++) {
		const kafka::Delivery &d = deliveries[i];
		if (d.reported && !d.refused_at_produce && d.err != 0) {
			return true;
		}
	}
	return false;
}

// In an aborted transaction a refusal says little of which event was at fault (a record batch is
// refused whole; the others' records are dropped with it). Each event the broker refused is sent
// again alone, in a transaction that is always aborted, so its record never reaches a
// read_committed consumer and may go ahead of its key; only a refusal of that solo send charges
// it an attempt. Bounded like IsolateRefusedBatches; what is not tried goes back to pending.
void
IsolateRefusedInTransactions(const Batch &batch, Outcome *outcomes, kafka::Delivery *deliveries, const char **errors) {
	TimestampTz until = TimestampTzPlusMilliseconds(GetCurrentTimestamp(), settings.publish_timeout_ms);
	int tried = 0;
	for (int i = 0; i < batch.n; i++) {
		if (outcomes[i] != Outcome::Rejected || deliveries[i].refused_at_produce) {
			continue;
		}
		outcomes[i] = Outcome::Requeued;
		char why[256];
		if (tried >= kMaxSoloSendsPerBatch || StopRequested() || GetCurrentTimestamp() >= until || !producer ||
		    kafka::BeginTransaction(producer, why, sizeof(why)) != kafka::TxnResult::Done) {
			continue;
		}
		tried++;
		bool refused_with_others = RefusedWithItsBatch(deliveries[i]);
		long left_ms = TimestampDifferenceMilliseconds(GetCurrentTimestamp(), until);
		bool complete = SendEvents(batch, &i, 1, deliveries, left_ms + kPublishWaitMarginMs, nullptr);
		bool ignored = false;
		TakeResult(i, deliveries[i], outcomes, errors, &ignored);
		if (outcomes[i] == Outcome::Published && refused_with_others) {
			// It passes alone and was refused with the others of its record batch: claimed alone,
			// each in a transaction of its own, as far as the batch went up to it, so the batch is
			// not refused again and again (nothing is ever charged for it).
			solo_claims_left = Max(solo_claims_left, Min(i + 1, kMaxSoloSendsPerBatch));
		}
		if (outcomes[i] != Outcome::Rejected) {
			outcomes[i] = Outcome::Requeued; // appended alone: not its fault
		}
		if (!complete) {
			DestroyProducer(); // nothing of it may be appended later
		} else {
			AbortKafkaTransaction();
		}
	}
}

// The batch's Kafka transaction failed: it is aborted, nothing of it counts as published (the
// events go back to pending without an attempt; a timed-out partition's are deferred), the
// events refused alone are charged, and the record commits (no prepare: Kafka keeps nothing).
int
RecordFailedTransaction(const Batch &batch, Outcome *outcomes, kafka::Delivery *deliveries, const char **errors,
                        bool *recorded, bool *broker_trouble) {
	AbortKafkaTransaction();
	for (int i = 0; i < batch.n; i++) {
		if (outcomes[i] == Outcome::Published) {
			outcomes[i] = Outcome::Requeued;
		}
	}
	IsolateRefusedInTransactions(batch, outcomes, deliveries, errors);
	bool any_rejected = false;
	for (int i = 0; i < batch.n; i++) {
		any_rejected = any_rejected || outcomes[i] == Outcome::Rejected || outcomes[i] == Outcome::Deferred;
	}
	if (!any_rejected) {
		*broker_trouble = true; // nothing of it is the events' fault: the broker's
	}
	SetWorkerState(slot, WorkerState::Recording);
	return RecordOutcomes(batch, outcomes, deliveries, errors, DeferMs(), recorded);
}

// A batch in one Kafka transaction, its record prepared before the Kafka commit and committed
// after it (the order argument and the crash table: DESIGN.md "Exactly once"):
//   claim (the caller) -> begin -> produce, every report in -> PREPARE 'outbox:<id>:<s>' ->
//   the group's offset s and commit in Kafka -> COMMIT PREPARED.
// When the Kafka commit's outcome is unknown the producer goes and the prepared batch waits for
// RecoverTransactionalSlot, which decides it by the group's offset before any claim.
void
RunTransactionalBatch(const Batch &batch) {
	int n = batch.n;
	Outcome *outcomes = static_cast<Outcome *>(palloc0(sizeof(Outcome) * n));
	kafka::Delivery *deliveries = static_cast<kafka::Delivery *>(palloc0(sizeof(kafka::Delivery) * n));
	const char **errors = static_cast<const char **>(palloc0(sizeof(char *) * n));
	bool *recorded = static_cast<bool *>(palloc0(sizeof(bool) * n));
	bool broker_trouble = false;
	char why[512];

	MaybeCrashAt("after_claim");
	SetWorkerState(slot, WorkerState::Publishing);
	pgstat_report_activity(STATE_RUNNING, "outbox relay: publish");
	instr_time publish_start = MetricsNow();
	kafka::TxnResult begun = kafka::BeginTransaction(producer, why, sizeof(why));
	bool complete = false;
	if (begun == kafka::TxnResult::Done) {
		complete = Publish(batch, outcomes, deliveries, errors, recorded, &broker_trouble, true);
	} else {
		DestroyProducer(); // a producer in a state that refuses a transaction: made anew
		for (int i = 0; i < n; i++) {
			outcomes[i] = batch.events[i].quarantine ? Outcome::Quarantined : Outcome::Requeued;
			errors[i] = batch.events[i].quarantine ? batch.events[i].quarantine : pstrdup(why);
		}
	}
	MetricsNotePublish(slot, publish_start);
	MaybeCrashAt("after_produce");

	instr_time record_start = MetricsNow();
	int failed;
	if (begun != kafka::TxnResult::Done || KafkaTransactionFailed(batch, deliveries, complete)) {
		failed = RecordFailedTransaction(batch, outcomes, deliveries, errors, recorded, &broker_trouble);
		error_steps = 0;
		MetricsNoteBatch(slot, batch, outcomes, failed, record_start);
		NoteBatchRecorded(batch, outcomes, errors, failed, broker_trouble);
		return;
	}

	SetWorkerState(slot, WorkerState::Recording);
	char *gid = PreparedBatchGid(transactional_id, next_sequence, producer_progress_topic);
	failed = RecordOutcomes(batch, outcomes, deliveries, errors, DeferMs(), recorded, gid);
	MaybeCrashAt("after_prepare");
	// The PREPARE on the failover standbys before Kafka commits (outbox.failover_standbys): a
	// failover to one of them then finds the batch prepared and decides it by Kafka's record
	// instead of sending it again. Not confirmed in time (with failover_on_timeout = wait), or a
	// stop: the batch is not committed anywhere and goes back to pending.
	kafka::TxnResult committed = kafka::TxnResult::Abortable;
	bool attempted = false; // the Kafka commit was asked for
	// The offset goes to the topic the gid names (a reload between batches remakes the producer).
	snprintf(why, sizeof(why), "the failover standbys did not confirm the batch's PREPARE");
#if PG_VERSION_NUM >= 150000
	XLogRecPtr prepared_end = GetFlushRecPtr(nullptr);
#else
	XLogRecPtr prepared_end = GetFlushRecPtr();
#endif
	if (WaitForFailoverStandbys(prepared_end) == StandbyWait::Reached) {
		attempted = true;
		committed = kafka::CommitTransaction(producer, transactional_id, producer_progress_topic, next_sequence,
		                                     PreparedBatchMark(gid), TransactionBudgetMs(), why, sizeof(why));
	}
	if (committed == kafka::TxnResult::Done) {
		MaybeCrashAt("after_kafka_commit");
		FinishPreparedBatch(gid, true);
		next_sequence++;
		MaybeCrashAt("after_postgres_commit");
		error_steps = 0;
		MetricsNoteBatch(slot, batch, outcomes, failed, record_start);
		NoteBatchRecorded(batch, outcomes, errors, failed, broker_trouble);
		return;
	}
	// Nothing of the batch counts as published: either Kafka aborted it (then so does Postgres) or
	// its fate is unknown (then recovery decides the prepared record before the next claim).
	for (int i = 0; i < n; i++) {
		outcomes[i] = Outcome::Requeued;
		errors[i] = nullptr;
	}
	errors[0] = psprintf("Kafka transaction of batch %lld not committed: %s", (long long)next_sequence, why);
	// A commit that was asked for is in doubt whatever it answered (an abortable error, a timeout,
	// a fence): only the group's offset, read by the next producer's recovery, decides it. One that
	// was never asked for (the failover standbys did not confirm the PREPARE) is aborted here.
	if (!attempted && producer &&
	    kafka::AbortTransaction(producer, TransactionBudgetMs(), why, sizeof(why)) == kafka::TxnResult::Done) {
		FinishPreparedBatch(gid, false);
	} else {
		ereport(LOG, (errmsg("outbox relay %d: the Kafka commit of batch %lld is in doubt (%s); its record stays "
		                     "prepared as \"%s\" until Kafka's record of the batch decides it",
		                     worker_index, (long long)next_sequence, errors[0], gid)));
		DestroyProducer();
	}
	MetricsNoteBatch(slot, batch, outcomes, 0, record_start);
	NoteBatchRecorded(batch, outcomes, errors, 0, committed != kafka::TxnResult::Stopped && !HeldBackForStandbys());
}

// A recovery step that could not be taken: the worker waits (broker trouble) or says why
// (misconfigured) and tries again with a new producer.
void
NoteRecoveryTrouble(kafka::TxnResult result, const char *why) {
	DestroyProducer();
	if (result == kafka::TxnResult::Stopped) {
		return;
	}
	if (result == kafka::TxnResult::Refused || result == kafka::TxnResult::Fatal) {
		SetWorkerError(slot, WorkerState::Misconfigured, why);
		NoteBrokerTrouble(why, true);
	} else {
		SetWorkerError(slot, WorkerState::BackingOff, why);
		NoteBrokerTrouble(why);
	}
}

// A prepared batch that Kafka's record cannot decide: never guessed (the batch may be in Kafka
// and not in Postgres, or the other way round). The worker claims nothing until an operator
// decides it (docs/exactly-once.md "A batch in doubt").
void
NoteUndecidable(const char *gid, const char *why) {
	char *error = psprintf("prepared transaction \"%s\" cannot be decided: %s", gid, why);
	SetWorkerError(slot, WorkerState::Misconfigured, error);
	NoteBrokerTrouble(error, true);
	LogOnce(WARNING, psprintf("not publishing: %s; see docs/exactly-once.md \"A batch in doubt\"", error));
}

// Decides every prepared batch of identity `id` by the committed offset of its group (`p` is a
// producer of that id whose InitTransactions has run, so no transaction of it is open): batch s
// with offset s committed in Kafka (COMMIT PREPARED), with offset s - 1 it did not (ROLLBACK
// PREPARED). *committed: the offset (0 for none). False when it cannot be done.
bool
DecidePreparedBatches(kafka::Producer *p, const char *id, int64 *committed) {
	char why[512];
	int64_t offset = -1;
	char mark[64];
	kafka::TxnResult read = kafka::ReadCommittedOffset(p, id, settings.progress_topic, TransactionBudgetMs(), &offset,
	                                                   mark, sizeof(mark), why, sizeof(why));
	if (read != kafka::TxnResult::Done) {
		NoteRecoveryTrouble(read, why);
		return false;
	}
	ListCell *lc;
	foreach (lc, PreparedBatchGids(psprintf("outbox:%s:", id), settings.relay_role)) {
		const char *gid = static_cast<const char *>(lfirst(lc));
		bool same_topic = false;
		int64 batch = PreparedBatchSequence(gid, id, settings.progress_topic, &same_topic);
		if (batch >= 1 && !same_topic) {
			NoteUndecidable(gid, psprintf("it was prepared while outbox.progress_topic named another topic than "
			                              "\"%s\", whose offsets cannot decide it",
			                              settings.progress_topic));
			return false;
		}
		// Batch s committed in Kafka carries its own mark: s committed by another relay of this
		// identity (a copy of the cluster that kept the prefix, a split brain) does not, and this
		// record must not be committed for it (its events never reached Kafka).
		bool commit = batch >= 1 && offset == batch && strcmp(mark, PreparedBatchMark(gid)) == 0;
		bool rollback = batch >= 1 && (offset == batch - 1 || (offset < 0 && batch == 1));
		if (batch >= 1 && offset == batch && !commit) {
			NoteUndecidable(gid, psprintf("Kafka's batch %lld of group \"%s\" was committed with the mark \"%s\", not this "
			                              "batch's: another relay uses this identity",
			                              (long long)batch, id, mark));
			return false;
		}
		if (!commit && !rollback) {
			NoteUndecidable(gid, psprintf("the committed offset of Kafka group \"%s\" on topic \"%s\" is %lld%s", id,
			                              settings.progress_topic, (long long)offset,
			                              offset < 0 ? " (none: expired, or another topic)" : ""));
			return false;
		}
		ereport(LOG, (errmsg("outbox relay %d: batch %lld of \"%s\" is %s in Kafka: %s PREPARED \"%s\"", worker_index,
		                     (long long)batch, id, commit ? "committed" : "not committed",
		                     commit ? "COMMIT" : "ROLLBACK", gid)));
		FinishPreparedBatch(gid, commit);
	}
	*committed = offset < 0 ? 0 : int64(offset);
	return true;
}

// Batches in doubt of this database's other identities: those of another outbox.workers count
// (their lanes are now other workers'), decided by worker 0 with a producer of each old id
// (whose InitTransactions fences a worker of it still running); every other worker waits until
// none is left, as their rows are locked by them and a claim around them would let later events
// of their keys go first. A prepared batch of an identity this cluster does not make (another
// prefix, another system identifier) is reported, not decided.
bool
RecoverOtherIdentities(bool transactional) {
	char *ours = psprintf("%s-%llu-%u-", settings.transactional_id_prefix, (unsigned long long)GetSystemIdentifier(),
	                      unsigned(MyDatabaseId));
	// This count's identities: each decides its own batches (another worker's here would fence it).
	// At least once nobody would: worker 0 rolls them all back (exactly_once turned off with a batch
	// in doubt, whose locks would hold the slot's claims). Its events are pending again and sent
	// again: at least once, a duplicate if Kafka had committed the batch, never a loss; and no Kafka
	// answer is needed for it.
	char *this_count = transactional ? psprintf("outbox:%s%d-", ours, worker_count) : nullptr;
	ListCell *lc;
	foreach (lc, PreparedBatchGids("outbox:", settings.relay_role)) {
		const char *gid = static_cast<const char *>(lfirst(lc));
		if (this_count && strncmp(gid, this_count, strlen(this_count)) == 0) {
			continue;
		}
		if (!transactional && worker_index != 0) {
			SetWorkerState(slot, WorkerState::Recovering);
			return false; // worker 0 rolls it back
		}
		if (!transactional) {
			ereport(LOG, (errmsg("outbox relay %d: outbox.delivery is at_least_once: ROLLBACK PREPARED \"%s\" (its "
			                     "events are sent again)",
			                     worker_index, gid)));
			FinishPreparedBatch(gid, false);
			continue;
		}
		// outbox:<id>:<sequence>:<nonce>
		const char *id_start = gid + strlen("outbox:");
		const char *id_end = id_start;
		for (const char *colon = strchr(id_start, ':'); colon && strchr(colon + 1, ':'); colon = strchr(colon + 1, ':')) {
			id_end = colon;
		}
		if (strncmp(id_start, ours, strlen(ours)) != 0 || id_end <= id_start) {
			NoteUndecidable(gid, "it is a batch of another relay identity (another outbox.transactional_id_prefix, "
			                     "or a copy of this cluster)");
			return false;
		}
		if (worker_index != 0) {
			SetWorkerState(slot, WorkerState::Recovering);
			return false; // worker 0 decides it
		}
		char *id = pnstrdup(id_start, Size(id_end - id_start));
		kafka::ProducerConfig config = CurrentProducerConfig();
		config.transactional_id = id;
		char why[512];
		// Static, not on the stack: an ERROR in the decision (RecoverFromError) destroys it.
		old_identity_producer = kafka::CreateProducer(config, why, sizeof(why));
		if (old_identity_producer == nullptr) {
			NoteRecoveryTrouble(kafka::TxnResult::Refused, why);
			return false;
		}
		kafka::TxnResult fenced = kafka::InitTransactions(old_identity_producer, TransactionTimeoutMs(), why, sizeof(why));
		int64 committed = 0;
		bool decided = fenced == kafka::TxnResult::Done && DecidePreparedBatches(old_identity_producer, id, &committed);
		kafka::DestroyProducer(old_identity_producer);
		old_identity_producer = nullptr;
		if (fenced != kafka::TxnResult::Done) {
			NoteRecoveryTrouble(fenced, why);
		}
		if (!decided) {
			return false;
		}
	}
	return true;
}

// Before a transactional producer's first claim: fence every earlier producer of the worker's
// id (a worker before a restart, a zombie), then decide the batch it may have left in doubt.
bool
RecoverTransactionalSlot() {
	SetWorkerState(slot, WorkerState::Recovering);
	char why[512];
	kafka::TxnResult made =
	    kafka::EnsureProgressTopic(producer, settings.progress_topic, TransactionBudgetMs(), why, sizeof(why));
	if (made == kafka::TxnResult::Refused) {
		LogOnce(WARNING, why); // it may exist all the same: the first commit tells
	} else if (made != kafka::TxnResult::Done) {
		NoteRecoveryTrouble(made, why);
		return false;
	}
	// Once per producer (librdkafka refuses a second one): a recovery that waits for worker 0 to
	// decide an old count's batch comes back here with the producer ready.
	if (!transactions_ready) {
		kafka::TxnResult fenced = kafka::InitTransactions(
		    producer, TransactionTimeoutMs(), why, sizeof(why));
		if (fenced != kafka::TxnResult::Done) {
			NoteRecoveryTrouble(fenced, why);
			return false;
		}
		transactions_ready = true;
	}
	int64 committed = 0;
	if (!RecoverOtherIdentities(true) || !DecidePreparedBatches(producer, transactional_id, &committed)) {
		return false;
	}
	next_sequence = committed + 1;
	recovered = true;
	return true;
}

// After a retention round on the ring: the metrics, and a WARNING (once a minute) while a member
// sealed past the window could not be emptied and the member after the current one is not free,
// so the current member is not sealed and grows without bound (DESIGN.md "Retention"); a LOG
// line once the ring rotates freely again.
void
NoteRingRetention(const RingRetentionOutcome &ring) {
	bool overdue = ring.overdue_member >= 0;
	MetricsNoteRingRetention(slot, ring.oldest_sealed_at, overdue);
	if (!overdue || !ring.rotation_blocked) {
		if (ring_warned) {
			ereport(LOG, (errmsg("outbox relay %d: the ring's retention empties its members again", worker_index)));
			ring_warned = false;
			last_ring_warning_at = 0;
		}
		return;
	}
	TimestampTz now = GetCurrentTimestamp();
	if (last_ring_warning_at != 0 && !TimestampDifferenceExceeds(last_ring_warning_at, now, kRepeatLogLineMs)) {
		return;
	}
	last_ring_warning_at = now;
	ring_warned = true;
	long seconds = long((now - ring.overdue_sealed_at) / USECS_PER_SEC);
	const char *why = ring.kept_because[0] != '\0' ? ring.kept_because : "the reason could not be told";
	const char *hint;
	if (strncmp(ring.kept_because, "locked by", 9) == 0) {
		hint = "End that session's transaction (pg_stat_activity shows it; pg_terminate_backend() ends it); the next "
		       "round empties the member. outbox.ring_status shows every member and what keeps it.";
	} else if (strstr(ring.kept_because, "cursor") != nullptr) {
		hint = "A relay worker of the ring has not published past the member: see outbox.workers for its state and "
		       "last_error. outbox.ring_status shows every member and what keeps it.";
	} else {
		hint = "outbox.ring_status shows every member and what keeps it.";
	}
	ereport(WARNING,
	        (errmsg("outbox relay %d: the ring's retention cannot empty outbox.events_%d, sealed %ld s ago; no member is "
	                "free, so the current member is not rotated and grows",
	                worker_index, ring.overdue_member, seconds),
	         errdetail("outbox.events_%d was sealed longer than outbox.retention (%d s) ago and is kept: %s.",
	                   ring.overdue_member, settings.retention_s, why),
	         errhint("%s", hint)));
}

void
MaybePurge() {
	if (worker_index != 0 || settings.retention_s <= 0) {
		return; // one worker keeps retention
	}
	TimestampTz now = GetCurrentTimestamp();
	long interval_ms = Max(kMinPurgeIntervalMs, Min(kPurgeIntervalMs, long(settings.retention_s) * 100L));
	if (last_purge != 0 && !TimestampDifferenceExceeds(last_purge, now, int(interval_ms))) {
		return;
	}
	last_purge = now;
	for (int i = 0; i < kMaxPurgeBatchesPerRound && !ShutdownRequestPending; i++) {
		int64 n = PurgeBatch(settings.retention_s, settings.purge_batch_size, &ring_outcome);
		if (ring_outcome.on_ring) {
			NoteRingRetention(ring_outcome);
		}
		if (n < settings.purge_batch_size) {
			break;
		}
	}
}

// Events of the batch in flight that Kafka acknowledged: their rows stay pending (the record
// was rolled back) and the next claim sends them again.
int64
AckedOfBatchInFlight() {
	int64 acked = 0;
	for (int i = 0; batch_outcomes && i < batch_size_in_flight; i++) {
		acked += batch_outcomes[i] == Outcome::Published;
	}
	if (acked == 0 && batch_outcomes && producer) {
		acked = kafka::Acked(producer); // cut short while sending: the acks so far
	}
	return acked;
}

// After a step's ERROR: the next try waits as for broker trouble, doubling with each error in a
// row. A step that keeps failing after the publish (a trigger on outbox.events that raises, a
// constraint the record breaks) would otherwise send its batch to Kafka again once a pause,
// duplicates without bound; each such re-send is counted (events_resent).
void
BackOffAfterError() {
	int64 resent = AckedOfBatchInFlight();
	batch_outcomes = nullptr;
	error_steps++;
	long delay = Max(kErrorPauseMs, BackoffMs(error_steps));
	// Never shortens a broker backoff under way.
	backoff_until = Max(backoff_until, TimestampTzPlusMilliseconds(GetCurrentTimestamp(), delay));
	backoff_state = WorkerState::BackingOff;
	MetricsNoteStepError(slot, uint64(resent), backoff_until);
	if (resent > 0) {
		ereport(LOG, (errmsg("outbox relay %d: %lld events reached Kafka but their outcome could not be recorded; "
		                     "they stay pending and will be sent again (duplicates); retrying in %ld ms",
		                     worker_index, (long long)resent, delay)));
	}
}

// Recovery from an ERROR anywhere in the loop. Step for step what the autovacuum launcher's
// recovery block does (postmaster/autovacuum.c, "a stripped down version of PostgresMain error
// recovery"), plus what PostgresMain adds for a process that reports its activity; then the
// relay's own state.
void
RecoverFromError() {
	// Since not using PG_TRY, reset the error context stack by hand: it still points into the
	// frames of whatever raised, and the next report would walk them.
	error_context_stack = nullptr;
	HOLD_INTERRUPTS();
	// Forget a pending cancel or timeout: the recovery itself is the answer to it.
	disable_all_timeouts(false);
	QueryCancelPending = false; // second, to avoid a race with a timeout firing meanwhile

	MemoryContextSwitchTo(TopMemoryContext);
	ErrorData *edata = CopyErrorData();
	EmitErrorReport();
	debug_query_string = nullptr;
	AbortCurrentTransaction(); // also restores the user and security context of the step

	// Resources held outside a transaction.
	LWLockReleaseAll();
	pgstat_report_wait_end();
#if PG_VERSION_NUM >= 180000
	pgaio_error_cleanup();
#elif PG_VERSION_NUM < 160000
	AbortBufferIO();
#endif
	UnlockBuffers();
	if (AuxProcessResourceOwner) {
		ReleaseAuxProcessResources(false);
	}
	AtEOXact_Buffers(false);
	AtEOXact_SMgr();
	AtEOXact_Files(false);
	AtEOXact_HashTables(false);

	MemoryContextSwitchTo(TopMemoryContext);
	FlushErrorState();
	// The message goes to outbox.workers; a step never raises with a secret in its text.
	SetWorkerError(slot, WorkerState::BackingOff, edata->message ? edata->message : "error");
	FreeErrorData(edata);
	BackOffAfterError();
	MemoryContextReset(batch_context);
	// The Kafka side of a batch cut short is unknown: drop the producer so nothing of it can be
	// appended after the events are sent again (their rows are still pending).
	// exactly_once: whatever the step was, a new producer's recovery (InitTransactions, the group's
	// offset) decides what is open or prepared before the next claim.
	if (producer && (kafka::Outstanding(producer) > 0 || transactional_id[0] != '\0')) {
		DestroyProducer();
	}
	if (old_identity_producer) {
		kafka::DestroyProducer(old_identity_producer);
		old_identity_producer = nullptr;
	}
	pgstat_report_activity(STATE_IDLE, nullptr);
	RESUME_INTERRUPTS();
}

void
OnExit(int, Datum) {
	if (slot == nullptr) {
		return;
	}
	SpinLockAcquire(&slot->mutex);
	slot->pid = 0;
	slot->latch = nullptr;
	slot->state = WorkerState::Stopped;
	SpinLockRelease(&slot->mutex);
}

// outbox.workers as this database sees it (ALTER DATABASE ... SET, the configuration files):
// when it is not the count this worker runs with, it asks the launcher for a restart of the
// database's workers with it and exits (all of them must agree on who owns a lane).
void
ExitIfWorkerCountChanged() {
	if (settings.workers == worker_count) {
		return;
	}
	ereport(LOG, (errmsg("outbox relay %d: outbox.workers is %d for database \"%s\", not %d: restarting its workers",
	                     worker_index, settings.workers, database_name, worker_count)));
	DestroyProducer();
	SpinLockAcquire(&slot->mutex);
	slot->wanted = settings.workers;
	slot->resize = true;
	SpinLockRelease(&slot->mutex);
	WakeLauncher();
	proc_exit(0);
}

// Takes the slot the launcher reserved (launcher.cpp) and connects to its database.
void
Attach(int slot_number, uint32 generation) {
	slot = SlotOf(slot_number);
	SpinLockAcquire(&slot->mutex);
	// A worker registered for an earlier reservation (a launcher restarted meanwhile).
	bool mine = slot->generation == generation && slot->database != InvalidOid;
	Oid database = slot->database;
	if (mine) {
		worker_index = slot->index;
		worker_count = slot->n_workers;
		slot->pid = MyProcPid;
		slot->latch = MyLatch;
		slot->state = WorkerState::Starting;
		slot->broker = BrokerState::Unknown;
		slot->published = 0;
		slot->failed = 0;
		slot->started_at = GetCurrentTimestamp();
		MetricsResetLocked(&slot->metrics);
	}
	SpinLockRelease(&slot->mutex);
	if (!mine) {
		proc_exit(0);
	}
	database_name = pstrdup(slot->database_name);
	before_shmem_exit(OnExit, 0);

	// Like autovacuum, the relay is the server's own process: ALTER DATABASE ... ALLOW_CONNECTIONS
	// false (which the database's owner may do) keeps sessions out, not the relay. To stop it:
	// ALTER DATABASE ... SET outbox.workers = 0, or DROP EXTENSION. A database dropped meanwhile
	// is a FATAL exit here; the launcher's next scan forgets it.
	BackgroundWorkerInitializeConnectionByOid(database, InvalidOid, BGWORKER_BYPASS_ALLOWCONN);
	MetricsNoteConnected(slot);
	// Pinned before the first transaction (a database's serializable deferrable default would
	// make even the extension check below wait).
	PinSessionSettings();
	// The launcher cannot see pg_extension: a worker of a database where it is missing says so
	// and leaves (no process stays in a database without the extension).
	if (!SingleDatabaseMode() && !ExtensionInstalled()) {
		SpinLockAcquire(&slot->mutex);
		slot->extension_missing = true;
		SpinLockRelease(&slot->mutex);
		proc_exit(0);
	}
	SpinLockAcquire(&slot->mutex);
	slot->extension_present = true;
	SpinLockRelease(&slot->mutex);
	ExitIfWorkerCountChanged();
	SpinLockAcquire(&slot->mutex);
	slot->count_confirmed = true;
	SpinLockRelease(&slot->mutex);
	WakeLauncher(); // it starts the database's other workers now

	ResetDatabaseSettings();
	InitStatementStopCheck();
}

// Why nothing was claimed, said once (not once per poll), then a wait before the next try.
void
ReportTableState(TableState table) {
	if (table == TableState::Missing && !SingleDatabaseMode()) {
		DestroyProducer();
		SpinLockAcquire(&slot->mutex);
		slot->extension_missing = true;
		SpinLockRelease(&slot->mutex);
		ExitForMissingExtension(database_name, worker_index);
	}
	if (table == TableState::Missing && last_table_state != TableState::Missing) {
		ereport(LOG, (errmsg("outbox relay %d: extension \"outbox\" is not installed in database \"%s\"; "
		                     "waiting for CREATE EXTENSION outbox",
		                     worker_index, database_name)));
	}
	if (table == TableState::Refused) {
		const char *problem = LastStepProblem();
		SetWorkerError(slot, WorkerState::Misconfigured, problem);
		LogOnce(WARNING, psprintf("not publishing: %s", problem));
	}
	last_table_state = table;
	switch (table) {
	case TableState::Missing:
		SetWorkerState(slot, WorkerState::NoExtension);
		WaitFor(settings.poll_interval_ms);
		break;
	case TableState::Refused:
		WaitFor(settings.poll_interval_ms);
		break;
	default: // Busy: DDL holds the table for a moment
		SetWorkerState(slot, WorkerState::Idle);
		WaitFor(kErrorPauseMs);
		break;
	}
}

void
RelayMain(Datum arg) {
	// Handlers first, then unblock (a default SIGTERM handler could FATAL inside a spinlock).
	pqsignal(SIGTERM, SignalHandlerForShutdownRequest);
	pqsignal(SIGHUP, SignalHandlerForConfigReload);
	BackgroundWorkerUnblockSignals();
	// Until the handler above, bgworker.c ignores SIGHUP: a reload signalled between the fork and
	// here is lost, and this worker would keep the old outbox.workers. The loop reads the files once.
	ConfigReloadPending = true;

	uint32 generation;
	memcpy(&generation, MyBgworkerEntry->bgw_extra, sizeof(generation));
	Attach(DatumGetInt32(arg), generation);
	char appname[NAMEDATALEN];
	snprintf(appname, sizeof(appname), "outbox relay %d", worker_index);
	pgstat_report_appname(appname);
	ereport(LOG, (errmsg("outbox relay %d started for database \"%s\" (%d of %d workers)", worker_index,
	                     database_name, worker_index + 1, worker_count)));
	// Which librdkafka runs decides what the relay can do (SCRAM to Kafka 4.x needs 2.6.1): said once.
	ereport(LOG, (errmsg("outbox relay %d: librdkafka %s", worker_index, kafka::LibraryVersion())));

	batch_context = AllocSetContextCreate(TopMemoryContext, "outbox relay batch", ALLOCSET_DEFAULT_SIZES);

	sigjmp_buf local_sigjmp_buf;
	if (sigsetjmp(local_sigjmp_buf, 1) != 0) {
		RecoverFromError();
		PauseAfterError();
	}
	PG_exception_stack = &local_sigjmp_buf;

	while (!ShutdownRequestPending) {
		CHECK_FOR_INTERRUPTS();
		if (ConfigReloadPending) {
			ReloadSettings();
			ExitIfWorkerCountChanged(); // between batches: nothing in flight
		}
		// Everything an iteration allocates lives in batch_context and goes here.
		MemoryContextSwitchTo(batch_context);
		MemoryContextReset(batch_context);
		ForwardProducerLog();
		if (!EnsureProducer()) {
			WaitFor(settings.poll_interval_ms);
			continue;
		}
		TimestampTz now = GetCurrentTimestamp();
		if (backoff_until > now) {
			SetWorkerState(slot, backoff_state);
			WaitFor(TimestampDifferenceMilliseconds(now, backoff_until));
			continue;
		}
		MaybePurge();
		// A claim holds its rows' locks until the batch is recorded: not while the broker is
		// known to be down (the publish would hold them for outbox.publish_timeout).
		if (!kafka::BrokerReachable(producer, kBrokerProbeBudgetMs)) {
			NoteNoBrokerReachable();
			continue;
		}
		// exactly_once: a new producer decides what its predecessor left in doubt before any claim.
		// At least once: batches exactly_once left in doubt before it was turned off (their locks
		// would hold the claims), once per producer; none can exist without prepared transactions.
		if (!recovered && (Transactional() ? !RecoverTransactionalSlot()
		                                   : max_prepared_xacts > 0 && !RecoverOtherIdentities(false))) {
			if (backoff_until <= GetCurrentTimestamp()) {
				WaitFor(settings.poll_interval_ms);
			}
			continue;
		}
		recovered = true;
		// The last batch was held back for a lagging failover standby: claim (and lock) nothing
		// until it has caught up (standby_wait.cpp).
		if (!WaitForHeldBackStandbys(settings.poll_interval_ms)) {
			continue;
		}
		SetWorkerState(slot, WorkerState::Claiming);
		// Wake-ups noted so far (commits during a linger) are served by this claim, whose snapshot
		// is taken after: kept, they would end the next idle sleep at once for an empty claim.
		TakeWakeRequest(slot);
		Batch batch{0, nullptr, false, false};
		int64 requeued = 0;
		instr_time claim_start = MetricsNow();
		TableState table =
		    ClaimBatch(MyLanes(), batch_context, &batch, &requeued, Transactional() && solo_claims_left > 0 ? 1 : 0);
		if (batch.n > 0 && solo_claims_left > 0 && Transactional()) {
			solo_claims_left--;
		}
		MetricsNoteClaim(slot, claim_start);
		if (requeued > 0) {
			ereport(LOG, (errmsg("outbox relay %d: %lld in-flight events returned to pending", worker_index,
			                     (long long)requeued)));
		}
		if (table != TableState::Ready) {
			ReportTableState(table);
			continue;
		}
		last_table_state = table;
		if (batch.n == 0 && HeldBackForStandbys()) {
			continue; // state 'waiting for standby'; the wait is at the top
		}
		if (batch.n == 0 && batch.cut && batch.progressed) {
			error_steps = 0; // an empty claim cut short that moved on (held rows, a hole's window): on at once
			NoteCycleSucceeded(slot, now);
			continue;
		}
		if (batch.n == 0) {
			error_steps = 0;
			SetWorkerState(slot, WorkerState::Idle);
			long sleep_ms = settings.poll_interval_ms;
			int64 next_retry = MillisUntilNextRetry(MyLanes());
			if (next_retry >= 0 && next_retry < sleep_ms) {
				sleep_ms = long(next_retry) + 1;
			}
			NoteCycleSucceeded(slot, now); // claimed with the broker reachable: nothing wrong
			WaitFor(sleep_ms);
			continue;
		}
		if (Transactional()) {
			RunTransactionalBatch(batch);
		} else {
			RunBatch(batch);
		}
		if (backoff_until <= now) {
			NoteCycleSucceeded(slot, now); // a batch that errs sets last_error or a backoff
		}
		if (!batch.cut && backoff_until <= GetCurrentTimestamp()) { // a backoff's own wait comes first
			LingerAfterClaim(claim_start);
		}
	}

	SetWorkerState(slot, WorkerState::Stopped);
	DestroyProducer();
	ereport(LOG, (errmsg("outbox relay %d stopping", worker_index)));
	// Exit code 1: if this was a pg_terminate_backend() rather than a shutdown, the launcher
	// starts the worker again after a pause.
	proc_exit(1);
}

} // namespace

bool
StartRelayWorker(int slot_number, uint32 generation, BackgroundWorkerHandle **handle) {
	BackgroundWorker worker;
	memset(&worker, 0, sizeof(worker));
	worker.bgw_flags = BGWORKER_SHMEM_ACCESS | BGWORKER_BACKEND_DATABASE_CONNECTION;
	worker.bgw_start_time = BgWorkerStart_RecoveryFinished;
	// The launcher restarts workers itself (it knows whether their database still wants them).
	worker.bgw_restart_time = BGW_NEVER_RESTART;
	strlcpy(worker.bgw_library_name, "outbox", BGW_MAXLEN);
	strlcpy(worker.bgw_function_name, "outbox_relay_main", BGW_MAXLEN);
	WorkerSlot *reserved = SlotOf(slot_number);
	snprintf(worker.bgw_name, BGW_MAXLEN, "outbox relay %d of database %s", reserved->index, reserved->database_name);
	strlcpy(worker.bgw_type, "outbox relay", BGW_MAXLEN);
	worker.bgw_main_arg = Int32GetDatum(slot_number);
	memcpy(worker.bgw_extra, &generation, sizeof(generation));
	worker.bgw_notify_pid = MyProcPid;
	return RegisterDynamicBackgroundWorker(&worker, handle);
}

} // namespace outbox

extern "C" {
PGDLLEXPORT void outbox_relay_main(Datum arg);

void
outbox_relay_main(Datum arg) {
	outbox::CallFromPostgres("outbox_relay_main", outbox::RelayMain, arg);
}
}
