// Kafka transactions of outbox.delivery = exactly_once. See kafka_transactions.hpp.
#include "kafka/kafka_transactions.hpp"

#include <librdkafka/rdkafka.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "kafka/producer_handle.hpp"
#include "shared/no_postgres.hpp"

namespace outbox::kafka {

namespace {

using Clock = std::chrono::steady_clock;

long
MillisLeft(Clock::time_point deadline) {
	return long(std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count());
}

// Takes (and destroys) a transactional call's error.
TxnResult
Judge(rd_kafka_error_t *error, char *why, size_t len) {
	if (error == nullptr) {
		return TxnResult::Done;
	}
	snprintf(why, len, "%s: %s", rd_kafka_err2name(rd_kafka_error_code(error)), rd_kafka_error_string(error));
	TxnResult result = rd_kafka_error_is_fatal(error)            ? TxnResult::Fatal
	                   : rd_kafka_error_txn_requires_abort(error) ? TxnResult::Abortable
	                   : rd_kafka_error_is_retriable(error) ||
	                           rd_kafka_error_code(error) == RD_KAFKA_RESP_ERR__TIMED_OUT
	                       ? TxnResult::TimedOut
	                       : TxnResult::Refused;
	rd_kafka_error_destroy(error);
	return result;
}

// Calls `call(slice_ms)` again while it times out (librdkafka resumes the operation under way),
// until the budget or a stop request.
template <typename Call>
TxnResult
Sliced(Producer *p, int budget_ms, char *why, size_t len, Call call) {
	auto deadline = Clock::now() + std::chrono::milliseconds(budget_ms);
	for (;;) {
		int slice = int(std::max(1L, std::min(long(kMetadataLookupMs), MillisLeft(deadline))));
		TxnResult result = Judge(call(slice), why, len);
		if (result != TxnResult::TimedOut) {
			return result;
		}
		if (StopRequestedOf(p)) {
			snprintf(why, len, "stopped while waiting for Kafka");
			return TxnResult::Stopped;
		}
		if (MillisLeft(deadline) <= 0) {
			return TxnResult::TimedOut;
		}
	}
}

// Waits, in slices, for an admin result of `type` on `queue`.
rd_kafka_event_t *
AwaitAdminResult(Producer *p, rd_kafka_queue_t *queue, rd_kafka_event_type_t type, Clock::time_point deadline) {
	while (MillisLeft(deadline) > 0 && !StopRequestedOf(p)) {
		int slice = int(std::min(long(kMetadataLookupMs), MillisLeft(deadline)));
		rd_kafka_event_t *event = rd_kafka_queue_poll(queue, std::max(1, slice));
		if (event == nullptr) {
			continue;
		}
		if (rd_kafka_event_type(event) == type) {
			return event;
		}
		rd_kafka_event_destroy(event);
	}
	return nullptr;
}

} // namespace

TxnResult
InitTransactions(Producer *p, int budget_ms, char *why, size_t len) noexcept {
	rd_kafka_t *rk = HandleOf(p);
	return Sliced(p, budget_ms, why, len, [rk](int slice) { return rd_kafka_init_transactions(rk, slice); });
}

TxnResult
BeginTransaction(Producer *p, char *why, size_t len) noexcept {
	return Judge(rd_kafka_begin_transaction(HandleOf(p)), why, len);
}

TxnResult
CommitTransaction(Producer *p, const char *group, const char *topic, int64_t sequence, const char *mark,
                  int budget_ms, char *why, size_t len) noexcept {
	rd_kafka_t *rk = HandleOf(p);
	auto deadline = Clock::now() + std::chrono::milliseconds(budget_ms);
	rd_kafka_topic_partition_list_t *offsets = rd_kafka_topic_partition_list_new(1);
	rd_kafka_topic_partition_t *offset = rd_kafka_topic_partition_list_add(offsets, topic, 0);
	offset->offset = sequence;
	// Owned by the list (freed with it, by librdkafka's free).
	size_t mark_len = strlen(mark);
	offset->metadata = malloc(mark_len + 1);
	if (offset->metadata == nullptr) {
		rd_kafka_topic_partition_list_destroy(offsets);
		snprintf(why, len, "out of memory");
		return TxnResult::Refused;
	}
	memcpy(offset->metadata, mark, mark_len + 1);
	offset->metadata_size = mark_len;
	rd_kafka_consumer_group_metadata_t *metadata = rd_kafka_consumer_group_metadata_new(group);
	TxnResult result = Sliced(p, budget_ms, why, len, [&](int slice) {
		return rd_kafka_send_offsets_to_transaction(rk, offsets, metadata, slice);
	});
	rd_kafka_consumer_group_metadata_destroy(metadata);
	rd_kafka_topic_partition_list_destroy(offsets);
	if (result != TxnResult::Done) {
		return result;
	}
	return Sliced(p, int(std::max(1L, MillisLeft(deadline))), why, len,
	              [rk](int slice) { return rd_kafka_commit_transaction(rk, slice); });
}

TxnResult
AbortTransaction(Producer *p, int budget_ms, char *why, size_t len) noexcept {
	rd_kafka_t *rk = HandleOf(p);
	return Sliced(p, budget_ms, why, len, [rk](int slice) { return rd_kafka_abort_transaction(rk, slice); });
}

// Through a consumer handle of the group, not the producer's Admin API: librdkafka's
// ListConsumerGroupOffsets on a handle without a consumer group dereferences that group when the
// coordinator answers NOT_COORDINATOR or is still loading (librdkafka issue 5040), which happens
// at every broker restart: a segfault of the worker, and a crash restart of the whole server.
TxnResult
ReadCommittedOffset(Producer *p, const char *group, const char *topic, int budget_ms, int64_t *offset, char *mark,
                    size_t mark_len, char *why, size_t len) noexcept {
	mark[0] = '\0';
	rd_kafka_t *reader = NewGroupReader(p, group, why, len);
	if (reader == nullptr) {
		return TxnResult::Refused;
	}
	auto deadline = Clock::now() + std::chrono::milliseconds(budget_ms);
	TxnResult result = TxnResult::TimedOut;
	snprintf(why, len, "no answer from Kafka within %d ms reading the committed offset of the relay's group", budget_ms);
	rd_kafka_topic_partition_list_t *partitions = rd_kafka_topic_partition_list_new(1);
	rd_kafka_topic_partition_list_add(partitions, topic, 0);
	// A stable read: while a transaction holding the group's offset is open the coordinator answers
	// UNSTABLE_OFFSET_COMMIT, which librdkafka asks again until the call's timeout.
	while (MillisLeft(deadline) > 0 && !StopRequestedOf(p)) {
		int slice = int(std::max(1L, std::min(long(kMetadataLookupMs), MillisLeft(deadline))));
		rd_kafka_resp_err_t err = rd_kafka_committed(reader, partitions, slice);
		if (err == RD_KAFKA_RESP_ERR_NO_ERROR) {
			err = partitions->elems[0].err;
		}
		if (err == RD_KAFKA_RESP_ERR_NO_ERROR) {
			*offset = partitions->elems[0].offset >= 0 ? partitions->elems[0].offset : -1;
			const rd_kafka_topic_partition_t &found = partitions->elems[0];
			if (found.metadata != nullptr && found.metadata_size > 0) {
				size_t n = std::min(found.metadata_size, mark_len - 1);
				memcpy(mark, found.metadata, n);
				mark[n] = '\0';
			}
			result = TxnResult::Done;
			break;
		}
		if (err == RD_KAFKA_RESP_ERR_GROUP_AUTHORIZATION_FAILED || err == RD_KAFKA_RESP_ERR_TOPIC_AUTHORIZATION_FAILED ||
		    err == RD_KAFKA_RESP_ERR__AUTHENTICATION || err == RD_KAFKA_RESP_ERR_INVALID_GROUP_ID) {
			snprintf(why, len, "reading the committed offset of the relay's group: %s: %s", rd_kafka_err2name(err),
			         rd_kafka_err2str(err));
			result = TxnResult::Refused;
			break;
		}
		snprintf(why, len, "reading the committed offset of the relay's group: %s", rd_kafka_err2name(err));
	}
	rd_kafka_topic_partition_list_destroy(partitions);
	// Never subscribed: nothing to leave, and no close that could wait on a coordinator.
	rd_kafka_destroy_flags(reader, RD_KAFKA_DESTROY_F_NO_CONSUMER_CLOSE);
	if (result == TxnResult::TimedOut && StopRequestedOf(p)) {
		result = TxnResult::Stopped;
	}
	return result;
}

namespace {

// Whether the brokers know `topic` (with a partition), asked in slices until the deadline: 1 yes,
// 0 no (the broker says it does not exist), -1 no answer.
int
TopicKnown(Producer *p, const char *topic, Clock::time_point deadline) {
	rd_kafka_t *rk = HandleOf(p);
	rd_kafka_topic_t *rkt = rd_kafka_topic_new(rk, topic, nullptr);
	if (rkt == nullptr) {
		return -1;
	}
	int known = -1;
	while (known < 0 && MillisLeft(deadline) > 0 && !StopRequestedOf(p)) {
		const struct rd_kafka_metadata *md = nullptr;
		int slice = int(std::max(1L, std::min(long(kMetadataLookupMs), MillisLeft(deadline))));
		rd_kafka_resp_err_t err = rd_kafka_metadata(rk, 0, rkt, &md, slice);
		if (err == RD_KAFKA_RESP_ERR_NO_ERROR && md != nullptr && md->topic_cnt == 1) {
			rd_kafka_resp_err_t topic_err = md->topics[0].err;
			if (topic_err == RD_KAFKA_RESP_ERR_NO_ERROR && md->topics[0].partition_cnt > 0) {
				known = 1;
			} else if (topic_err == RD_KAFKA_RESP_ERR_UNKNOWN_TOPIC_OR_PART) {
				known = 0;
			}
		}
		if (md != nullptr) {
			rd_kafka_metadata_destroy(md);
		}
	}
	rd_kafka_topic_destroy(rkt);
	return known;
}

} // namespace

TxnResult
EnsureProgressTopic(Producer *p, const char *topic, int budget_ms, char *why, size_t len) noexcept {
	rd_kafka_t *rk = HandleOf(p);
	auto deadline = Clock::now() + std::chrono::milliseconds(budget_ms);
	// Made by the operator (or an earlier start) in the usual case: then the relay needs no right
	// to create topics, and asks for nothing.
	int known = TopicKnown(p, topic, deadline);
	if (known == 1) {
		return TxnResult::Done;
	}
	if (known < 0) {
		snprintf(why, len, "no answer from Kafka within %d ms looking up the progress topic \"%s\"", budget_ms, topic);
		return StopRequestedOf(p) ? TxnResult::Stopped : TxnResult::TimedOut;
	}
	char errstr[256];
	rd_kafka_NewTopic_t *new_topic = rd_kafka_NewTopic_new(topic, 1, -1, errstr, sizeof(errstr));
	if (new_topic == nullptr) {
		snprintf(why, len, "progress topic \"%s\": %s", topic, errstr);
		return TxnResult::Refused;
	}
	rd_kafka_queue_t *queue = rd_kafka_queue_new(rk);
	rd_kafka_AdminOptions_t *options = rd_kafka_AdminOptions_new(rk, RD_KAFKA_ADMIN_OP_CREATETOPICS);
	(void)rd_kafka_AdminOptions_set_request_timeout(options, budget_ms, errstr, sizeof(errstr));
	rd_kafka_CreateTopics(rk, &new_topic, 1, options, queue);
	rd_kafka_AdminOptions_destroy(options);
	rd_kafka_NewTopic_destroy(new_topic);
	TxnResult result = TxnResult::TimedOut;
	snprintf(why, len, "no answer from Kafka within %d ms making the progress topic \"%s\"", budget_ms, topic);
	if (rd_kafka_event_t *event = AwaitAdminResult(p, queue, RD_KAFKA_EVENT_CREATETOPICS_RESULT, deadline)) {
		rd_kafka_resp_err_t err = rd_kafka_event_error(event);
		size_t n = 0;
		const rd_kafka_topic_result_t **topics =
		    err ? nullptr : rd_kafka_CreateTopics_result_topics(rd_kafka_event_CreateTopics_result(event), &n);
		if (err == RD_KAFKA_RESP_ERR_NO_ERROR && n == 1) {
			err = rd_kafka_topic_result_error(topics[0]);
		}
		if (err == RD_KAFKA_RESP_ERR_NO_ERROR || err == RD_KAFKA_RESP_ERR_TOPIC_ALREADY_EXISTS) {
			result = TxnResult::Done;
		} else {
			snprintf(why, len, "could not make the progress topic \"%s\": %s (make it with one partition, or grant "
			         "the relay CREATE on it)", topic, rd_kafka_err2name(err));
			result = err == RD_KAFKA_RESP_ERR__TIMED_OUT || err == RD_KAFKA_RESP_ERR__TRANSPORT ? TxnResult::TimedOut
			                                                                                   : TxnResult::Refused;
		}
		rd_kafka_event_destroy(event);
	} else if (StopRequestedOf(p)) {
		result = TxnResult::Stopped;
	}
	rd_kafka_queue_destroy(queue);
	return result;
}

} // namespace outbox::kafka
