// Failover-safe publishing: the wait for the standbys of outbox.failover_standbys (DESIGN.md
// "Failover"). The standbys' positions come from the walsenders' shared memory (WalSndCtl, each
// slot under its spinlock) and their names from the backend status array (a walsender's
// application_name): no SQL, so neither the relay role's rights nor a planted view matter.
// Plain C-style code: no C++ object lives on a stack that calls Postgres.
#include "relay/standby_wait.hpp"

#include "shared/guc.hpp"
#include "shared/shmem.hpp"

namespace outbox {

namespace {

constexpr int kMaxFailoverStandbys = 32;

// outbox.failover_standbys, parsed: n == 0 is off.
struct FailoverStandbys {
	int n;        // names listed
	int required; // how many must have the WAL: n for a plain list, the count of ANY
	bool any;     // ANY required (names): `required` of them (or of any standby, with *)
	bool wildcard;
	char names[kMaxFailoverStandbys][NAMEDATALEN];
};

const FailoverStandbys *standbys = nullptr; // the assigned value's parse (the GUC's extra)

// While a wait lasts shorter than this, the worker's state is left alone: a streaming standby
// confirms within milliseconds, and the view would flicker with every batch.
constexpr long kReportAfterMs = 500;
constexpr long kReportEveryMs = 250;
constexpr long kLogEveryMs = 60000;
// Walsenders set no latch of ours when a standby reports: the wait polls shared memory, in
// slices that start short (a streaming standby answers fast) and grow to this.
constexpr long kMaxSliceMs = 20;
constexpr size_t kReasonSize = sizeof(WorkerSlot::last_error); // what outbox.workers.last_error holds

XLogRecPtr held_back_lsn = InvalidXLogRecPtr; // what the last held-back batch needed
TimestampTz last_logged_at = 0;

bool
IsSpace(char c) {
	return c == ' ' || c == '\t' || c == '\n' || c == '\r';
}

const char *
SkipSpaces(const char *p) {
	while (IsSpace(*p)) {
		p++;
	}
	return p;
}

// Parses "a, b", "ANY n (a, b)" or "ANY n (*)". Returns nullptr, or why the value is refused.
const char *
ParseFailoverStandbys(const char *value, FailoverStandbys *out) {
	memset(out, 0, sizeof(*out));
	const char *p = SkipSpaces(value);
	if (*p == '\0') {
		return nullptr; // off
	}
	if (pg_strncasecmp(p, "FIRST", 5) == 0 && (IsSpace(p[5]) || (p[5] >= '0' && p[5] <= '9'))) {
		// synchronous_standby_names' priority form: which standbys it waits for changes with who is
		// connected, so it cannot say which standbys a failover may go to.
		return "FIRST n (...) is not supported: name the standbys, or use ANY n (...)";
	}
	if (pg_strncasecmp(p, "ANY", 3) == 0 && (IsSpace(p[3]) || (p[3] >= '0' && p[3] <= '9'))) {
		p = SkipSpaces(p + 3);
		long count = 0;
		if (*p < '0' || *p > '9') {
			return "ANY must be followed by the number of standbys, as in ANY 1 (a, b)";
		}
		for (; *p >= '0' && *p <= '9'; p++) {
			count = Min(count * 10 + (*p - '0'), 1000L); // past 32 it is refused below, however large
		}
		p = SkipSpaces(p);
		if (*p != '(') {
			return "the standbys of ANY n go in parentheses, as in ANY 1 (a, b)";
		}
		p++;
		if (count < 1 || count > kMaxFailoverStandbys) {
			return "the number of ANY n must be between 1 and 32";
		}
		out->any = true;
		out->required = int(count);
	}
	for (;;) {
		p = SkipSpaces(p);
		const char *start = p;
		while (*p && *p != ',' && *p != '(' && *p != ')' && *p != '"') {
			p++;
		}
		const char *end = p;
		while (end > start && IsSpace(end[-1])) {
			end--;
		}
		if (*p == '(' || *p == '"' || (*p == ')' && !out->any)) {
			return "a standby name cannot contain a parenthesis or a double quote";
		}
		int len = int(end - start);
		if (len == 0) {
			return "a standby name is empty";
		}
		if (len >= NAMEDATALEN) {
			return "a standby name is longer than an application_name can be (63 bytes)";
		}
		if (out->n == kMaxFailoverStandbys) {
			return "at most 32 standbys can be named";
		}
		if (len == 1 && start[0] == '*') {
			if (!out->any) {
				return "* (any standby) needs a count: ANY n (*)";
			}
			out->wildcard = true;
		}
		memcpy(out->names[out->n], start, len);
		out->names[out->n][len] = '\0';
		for (int i = 0; i < out->n; i++) {
			if (pg_strcasecmp(out->names[i], out->names[out->n]) == 0) {
				return "a standby is named twice";
			}
		}
		out->n++;
		if (*p == ',') {
			p++;
			continue;
		}
		break;
	}
	if (out->any) {
		if (*p != ')') {
			return "the list of ANY n (...) has no closing parenthesis";
		}
		p++;
	} else {
		out->required = out->n;
	}
	if (*SkipSpaces(p) != '\0') {
		return "unexpected text after the list of standbys";
	}
	if (out->any && !out->wildcard && out->required > out->n) {
		return "ANY n names fewer than n standbys";
	}
	return nullptr;
}

// The name this node streams under when it is a standby, as its walreceiver gives it:
// application_name of primary_conninfo (key=value or URI form), else cluster_name, else
// "walreceiver" (only with a primary_conninfo: a node that never was a standby and has no
// cluster_name has no name to leave out). A promoted standby keeps its primary_conninfo, so it
// knows its old name: a node never waits for itself, and one outbox.failover_standbys serves
// every node.
void
OwnStandbyName(char *out) {
	const char *conninfo = GetConfigOption("primary_conninfo", true, false);
	const char *cluster = GetConfigOption("cluster_name", true, false);
	bool has_conninfo = conninfo != nullptr && *SkipSpaces(conninfo) != '\0';
	strlcpy(out, cluster && cluster[0] ? cluster : has_conninfo ? "walreceiver" : "", NAMEDATALEN);
	if (!has_conninfo) {
		return;
	}
	char name[NAMEDATALEN];
	const char *key = "application_name";
	size_t key_len = strlen(key);
	for (const char *p = conninfo; (p = strstr(p, key)) != nullptr; p += key_len) {
		if (p != conninfo && !IsSpace(p[-1]) && p[-1] != '?' && p[-1] != '&') {
			continue; // part of another word
		}
		const char *v = SkipSpaces(p + key_len);
		if (*v != '=') {
			continue;
		}
		v = SkipSpaces(v + 1);
		int n = 0;
		if (*v == '\'') {
			for (v++; *v && *v != '\'' && n < NAMEDATALEN - 1; v++) {
				if (*v == '\\' && v[1]) {
					v++;
				}
				name[n++] = *v;
			}
		} else {
			while (*v && !IsSpace(*v) && *v != '&' && n < NAMEDATALEN - 1) {
				name[n++] = *v++;
			}
		}
		name[n] = '\0';
		if (n > 0) {
			strlcpy(out, name, NAMEDATALEN);
			return;
		}
	}
}

// One physical walsender: the standby's application_name and the position it reported.
struct Sender {
	int pid;
	XLogRecPtr lsn; // flush or replay, per outbox.failover_standby_lsn; invalid: none reported yet
	char name[NAMEDATALEN];
};

// The connected physical standbys (logical walsenders are connected to a database: skipped).
// `senders` has room for max_wal_senders.
int
ReadSenders(Sender *senders) {
	bool replay = settings.failover_standby_lsn == int(StandbyLsn::Replay);
	int n = 0;
	for (int i = 0; i < max_wal_senders; i++) {
		WalSnd *walsnd = &WalSndCtl->walsnds[i];
		SpinLockAcquire(&walsnd->mutex);
		int pid = walsnd->pid;
		XLogRecPtr lsn = replay ? walsnd->apply : walsnd->flush;
		SpinLockRelease(&walsnd->mutex);
		if (pid != 0) {
			senders[n].pid = pid;
			senders[n].lsn = lsn;
			senders[n].name[0] = '\0';
			n++;
		}
	}
	if (n == 0) {
		return 0;
	}
	// A fresh copy of the backend status array (the last one may be from before a standby came).
	OutboxClearBackendStatusCopy();
	int n_backends = pgstat_fetch_stat_numbackends();
	int named = 0;
	for (int b = 1; b <= n_backends; b++) {
		LocalPgBackendStatus *local = OutboxLocalBackendStatus(b);
		if (local == nullptr || local->backendStatus.st_backendType != B_WAL_SENDER ||
		    local->backendStatus.st_databaseid != InvalidOid) {
			continue;
		}
		for (int i = 0; i < n; i++) {
			if (senders[i].pid == local->backendStatus.st_procpid) {
				strlcpy(senders[i].name, local->backendStatus.st_appname, NAMEDATALEN);
			}
		}
	}
	OutboxClearBackendStatusCopy();
	// Walsenders not (or no longer) in the status array, and logical ones, drop out.
	for (int i = 0; i < n; i++) {
		if (senders[i].name[0] != '\0') {
			senders[named++] = senders[i];
		}
	}
	return named;
}

// The worst position any walsender of this name reported (a failover may go to any node that
// streams under the name: two standbys misnamed alike must both have the WAL; a standby's
// lingering old walsender holds the wait until wal_sender_timeout ends it); false when none is
// connected.
bool
PositionOf(const char *name, const Sender *senders, int n, XLogRecPtr *lsn) {
	bool found = false;
	*lsn = InvalidXLogRecPtr;
	for (int i = 0; i < n; i++) {
		if (pg_strcasecmp(senders[i].name, name) == 0) {
			*lsn = found ? Min(*lsn, senders[i].lsn) : senders[i].lsn;
			found = true;
		}
	}
	return found;
}

// LSN_FORMAT_ARGS is C only (its type check does not compile as C++).
#define LSN_HIGH_LOW(lsn) uint32((lsn) >> 32), uint32(lsn)

void
Append(char *buf, size_t size, const char *text) {
	size_t used = strlen(buf);
	if (used + 1 < size) {
		snprintf(buf + used, size - used, "%s%s", used > 0 ? "; " : "", text);
	}
}

void
DescribeLag(const char *name, bool connected, XLogRecPtr lsn, XLogRecPtr target, char *reason, size_t size) {
	char line[160];
	if (!connected) {
		snprintf(line, sizeof(line), "standby \"%s\" is not connected", name);
	} else if (XLogRecPtrIsInvalid(lsn)) {
		snprintf(line, sizeof(line), "standby \"%s\" has not reported a position yet", name);
	} else {
		snprintf(line, sizeof(line), "standby \"%s\" %s %X/%X, %llu bytes behind %X/%X", name,
		         settings.failover_standby_lsn == int(StandbyLsn::Replay) ? "replayed" : "flushed",
		         LSN_HIGH_LOW(lsn), (unsigned long long)(target - lsn), LSN_HIGH_LOW(target));
	}
	Append(reason, size, line);
}

// Whether enough of the named standbys have `target`; else `reason` names the ones behind.
// `self`: this node's own name (OwnStandbyName), left out unless a standby of that name streams
// from this node (no node streams from itself: that one is another node, a failover target).
bool
StandbysHave(const FailoverStandbys &cfg, const char *self, Sender *senders, XLogRecPtr target, char *reason,
             size_t size) {
	reason[0] = '\0';
	int n = ReadSenders(senders);
	int reached = 0, others = 0;
	for (int k = 0; k < cfg.n; k++) {
		if (strcmp(cfg.names[k], "*") == 0) {
			continue;
		}
		XLogRecPtr lsn;
		bool connected = PositionOf(cfg.names[k], senders, n, &lsn);
		if (!connected && pg_strcasecmp(cfg.names[k], self) == 0) {
			continue;
		}
		others++;
		if (connected && lsn >= target) {
			reached++;
		} else {
			DescribeLag(cfg.names[k], connected, lsn, target, reason, size);
		}
	}
	if (cfg.wildcard) {
		// Any standby counts, once per name (two walsenders of one name are one standby, at the worse position).
		reached = 0;
		int connected = 0;
		for (int i = 0; i < n; i++) {
			bool first = true;
			for (int j = 0; j < i && first; j++) {
				first = pg_strcasecmp(senders[i].name, senders[j].name) != 0;
			}
			XLogRecPtr lsn;
			PositionOf(senders[i].name, senders, n, &lsn);
			connected += first;
			reached += first && lsn >= target;
		}
		char line[96];
		snprintf(line, sizeof(line), "%d of %d connected standbys have %X/%X", reached, connected,
		         LSN_HIGH_LOW(target));
		reason[0] = '\0';
		Append(reason, size, line);
	}
	// Without this node in it, a list needs all the others, and ANY n at most all the others.
	int required = cfg.wildcard ? cfg.required : cfg.any ? Min(cfg.required, others) : others;
	if (reached >= required) {
		return true;
	}
	if (cfg.any) {
		char line[64];
		snprintf(line, sizeof(line), "%d of ANY %d have it", reached, required);
		Append(reason, size, line);
	}
	return false;
}

WorkerSlot *
MySlot() {
	static WorkerSlot *mine = nullptr;
	for (int i = 0; mine == nullptr && i < kMaxSlots; i++) {
		WorkerSlot *slot = SlotOf(i);
		SpinLockAcquire(&slot->mutex);
		bool is_mine = slot->pid == MyProcPid;
		SpinLockRelease(&slot->mutex);
		if (is_mine) {
			mine = slot;
		}
	}
	return mine;
}

void
Report(WorkerState state, const char *reason) {
	if (WorkerSlot *slot = MySlot()) {
		SetWorkerError(slot, state, reason);
	}
}

void
LogRateLimited(int level, const char *what, const char *reason) {
	TimestampTz now = GetCurrentTimestamp();
	if (last_logged_at != 0 && !TimestampDifferenceExceeds(last_logged_at, now, int(kLogEveryMs))) {
		return;
	}
	last_logged_at = now;
	WorkerSlot *slot = MySlot();
	ereport(level, (errmsg("outbox relay %d: %s", slot ? int(slot - SlotOf(0)) : -1, what), errdetail("%s", reason),
	                errhint("outbox.failover_standbys = '%s'", settings.failover_standbys)));
}

enum class Until { Reached, TimedOut, Reloaded, Stopped };

// Polls until the standbys have `target`, `timeout_ms` passes, or a reload is pending (the
// setting may have changed: the wait must not outlast it, however long the timeout); serves
// interrupts and ends on a stop request or postmaster death.
// `reason` (kReasonSize) says which standbys are behind when it ends otherwise.
Until
Poll(XLogRecPtr target, long timeout_ms, char *reason) {
	Sender *senders = static_cast<Sender *>(palloc(sizeof(Sender) * Max(max_wal_senders, 1)));
	char reported[kReasonSize] = "";
	char self[NAMEDATALEN];
	OwnStandbyName(self);
	TimestampTz start = GetCurrentTimestamp(), last_report = 0;
	long slice_ms = 1;
	Until result;
	for (;;) {
		if (StandbysHave(*standbys, self, senders, target, reason, kReasonSize)) {
			result = Until::Reached;
			break;
		}
		TimestampTz now = GetCurrentTimestamp();
		long waited = TimestampDifferenceMilliseconds(start, now);
		if (waited >= kReportAfterMs && strcmp(reason, reported) != 0 &&
		    TimestampDifferenceExceeds(last_report, now, int(kReportEveryMs))) {
			Report(WorkerState::WaitingForStandby, reason);
			strlcpy(reported, reason, kReasonSize);
			last_report = now;
		}
		if (ShutdownRequestPending) {
			result = Until::Stopped;
			break;
		}
		if (ConfigReloadPending) {
			result = Until::Reloaded;
			break;
		}
		if (waited >= timeout_ms) {
			result = Until::TimedOut;
			break;
		}
		long sleep_ms = Min(slice_ms, timeout_ms - waited);
		int rc = WaitLatch(MyLatch, WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH, Max(sleep_ms, 1L),
		                   PG_WAIT_EXTENSION);
		if (rc & WL_LATCH_SET) {
			ResetLatch(MyLatch); // a committed enqueue: the claim after this batch sees it
		}
		CHECK_FOR_INTERRUPTS();
		slice_ms = Min(slice_ms * 2, kMaxSliceMs);
	}
	pfree(senders);
	if (result == Until::TimedOut || result == Until::Reloaded) {
		// What the view shows for the wait that just ended (also one shorter than kReportAfterMs).
		Report(WorkerState::WaitingForStandby, reason);
	}
	return result;
}

bool
FailoverOff() {
	return standbys == nullptr || standbys->n == 0;
}

} // namespace

bool
CheckFailoverStandbys(char **newval, void **extra, GucSource) {
	FailoverStandbys parsed;
	const char *problem = ParseFailoverStandbys(*newval ? *newval : "", &parsed);
	if (problem) {
		GUC_check_errdetail("%s.", problem);
		GUC_check_errhint("A list of standbys' application_name (all of them must confirm), or "
		                  "ANY n (name, ...) or ANY n (*) (n of them must confirm); empty: off.");
		return false;
	}
#if PG_VERSION_NUM >= 160000
	void *copy = guc_malloc(LOG, sizeof(parsed));
#else
	void *copy = malloc(sizeof(parsed));
#endif
	if (copy == nullptr) {
		return false;
	}
	memcpy(copy, &parsed, sizeof(parsed));
	*extra = copy;
	return true;
}

void
AssignFailoverStandbys(const char *, void *extra) {
	standbys = static_cast<const FailoverStandbys *>(extra);
}

StandbyWait
WaitForFailoverStandbys(XLogRecPtr flushed) {
	held_back_lsn = InvalidXLogRecPtr;
	if (FailoverOff()) {
		return StandbyWait::Reached;
	}
	XLogRecPtr target = flushed; // the end of the inserted WAL (FlushBeforePublish), never past a page header
	char reason[kReasonSize];
	switch (Poll(target, settings.failover_wait_timeout_ms, reason)) {
	case Until::Reached:
		return StandbyWait::Reached;
	case Until::Stopped:
		return StandbyWait::Stopped;
	case Until::Reloaded:
		// Not a timeout (with publish it would publish unconfirmed): released unpublished, the
		// worker reloads and WaitForHeldBackStandbys goes on with the new value.
		held_back_lsn = target;
		return StandbyWait::HeldBack;
	case Until::TimedOut:
		break;
	}
	if (settings.failover_on_timeout == int(FailoverTimeoutPolicy::Publish)) {
		LogRateLimited(WARNING, "publishing a batch the failover standbys have not confirmed "
		               "(outbox.failover_on_timeout = publish)", reason);
		Report(WorkerState::Claiming, psprintf("published without standby confirmation: %s", reason));
		return StandbyWait::Reached;
	}
	LogRateLimited(LOG, "not publishing until the failover standbys confirm the WAL "
	               "(outbox.failover_on_timeout = wait)", reason);
	held_back_lsn = target;
	return StandbyWait::HeldBack;
}

bool
HeldBackForStandbys() {
	return !XLogRecPtrIsInvalid(held_back_lsn);
}

bool
WaitForHeldBackStandbys(long max_ms) {
	if (!HeldBackForStandbys()) {
		return true;
	}
	if (FailoverOff() || settings.failover_on_timeout == int(FailoverTimeoutPolicy::Publish)) {
		held_back_lsn = InvalidXLogRecPtr; // a reload turned the wait off
		return true;
	}
	if (WorkerSlot *slot = MySlot()) {
		SetWorkerState(slot, WorkerState::WaitingForStandby); // the reason is in last_error already
	}
	char reason[kReasonSize];
	if (Poll(held_back_lsn, max_ms, reason) != Until::Reached) {
		return false;
	}
	held_back_lsn = InvalidXLogRecPtr;
	WorkerSlot *slot = MySlot();
	ereport(LOG, (errmsg("outbox relay %d: the failover standbys caught up; publishing again",
	                     slot ? int(slot - SlotOf(0)) : -1)));
	return true;
}

} // namespace outbox
