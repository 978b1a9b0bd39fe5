-- The outbox.* settings, their defaults, contexts and bounds.
SELECT name, setting, unit, context, vartype, min_val, max_val, enumvals
FROM pg_settings WHERE name LIKE 'outbox.%' ORDER BY name;

-- Bad values are refused, and nothing is written. (The bounds are in the listing above; the
-- messages of settings with units spell the bounds differently from PostgreSQL 17 on, so those
-- show only their SQLSTATE.) The reserved prefix is tested in reserved_prefix.
\set VERBOSITY sqlstate
SET outbox.max_payload_bytes = -1;
ALTER SYSTEM SET outbox.publish_timeout = '10ms';
ALTER SYSTEM SET outbox.batch_linger = '2min';
\set VERBOSITY default
ALTER SYSTEM SET outbox.on_failed_event = 'drop';
ALTER SYSTEM SET outbox.workers = 33;
ALTER SYSTEM SET outbox.batch_size = 0;
ALTER SYSTEM SET outbox.kafka_connections = 0;
ALTER SYSTEM SET outbox.kafka_connections = 17;
ALTER SYSTEM SET outbox.message_timestamp = 'create';
ALTER SYSTEM SET outbox.traceparent = '00-00000000000000000000000000000000-b7ad6b7169203331-01';
ALTER SYSTEM SET outbox.failover_standbys = 'ANY 3 (a, b)';
ALTER SYSTEM SET outbox.failover_standby_lsn = 'write';
-- A librdkafka property the relay reserves is refused by every spelling librdkafka takes for it
-- (its name, an alias, the topic. prefix), whatever the value (even the relay's own), named as
-- written and as librdkafka knows it; the message never quotes the value (it may hold a secret).
\set VERBOSITY sqlstate
ALTER SYSTEM SET outbox.kafka_properties = 'topic.partitioner=random';
\set VERBOSITY default
ALTER SYSTEM SET outbox.kafka_properties = 'partitioner=random';
ALTER SYSTEM SET outbox.kafka_properties = 'client.id=a;topic.partitioner=random';
ALTER SYSTEM SET outbox.kafka_properties = 'client.id=a; topic.partitioner = murmur2_random';
ALTER SYSTEM SET outbox.kafka_properties = 'topic.message.timeout.ms=1000';
ALTER SYSTEM SET outbox.kafka_properties = 'topic.delivery.timeout.ms=1000';
ALTER SYSTEM SET outbox.kafka_properties = 'delivery.timeout.ms=1000';
ALTER SYSTEM SET outbox.kafka_properties = 'linger.ms=5';
ALTER SYSTEM SET outbox.kafka_properties = 'topic.acks=1';
ALTER SYSTEM SET outbox.kafka_properties = 'acks=all';
ALTER SYSTEM SET outbox.kafka_properties = 'request.required.acks=-1';
ALTER SYSTEM SET outbox.kafka_properties = 'max.in.flight=1';
ALTER SYSTEM SET outbox.kafka_properties = 'bootstrap.servers=elsewhere:9092';
ALTER SYSTEM SET outbox.kafka_properties = 'enable.idempotence=false';
ALTER SYSTEM SET outbox.kafka_properties = 'enable.gapless.guarantee=false';
ALTER SYSTEM SET outbox.kafka_properties = 'log.queue=false';
ALTER SYSTEM SET outbox.kafka_properties = 'internal.termination.signal=1';
-- Beyond 0.2.0's list: a LIFO queue reverses a key's events, a transactional id makes every
-- produce fail, a plugin (loaded as soon as it is set) runs its code in the server.
ALTER SYSTEM SET outbox.kafka_properties = 'topic.queuing.strategy=lifo';
ALTER SYSTEM SET outbox.kafka_properties = 'transactional.id=relay';
ALTER SYSTEM SET outbox.kafka_properties = 'plugin.library.paths=/nonexistent/plugin.so';
-- A value that holds a secret is left to the reload (refused there, test_kafka_reserved.py):
-- refused here, PostgreSQL would log the statement's text with the secret.
ALTER SYSTEM SET outbox.kafka_properties = 'sasl.password=Zq7s3cr3t;linger.ms=7';
ALTER SYSTEM RESET outbox.kafka_properties;
-- Other spellings are no property at all: librdkafka matches names exactly (case, blanks inside
-- a name, a doubled prefix). Accepted here, refused by the worker (names no librdkafka property).
ALTER SYSTEM SET outbox.kafka_properties = 'Partitioner=random;TOPIC.partitioner=random;topic.topic.partitioner=random';
SELECT count(*) AS written FROM pg_file_settings WHERE name = 'outbox.kafka_properties' AND sourcefile LIKE '%auto.conf';
ALTER SYSTEM RESET outbox.kafka_properties;
-- Tuning and security properties are the operator's.
ALTER SYSTEM SET outbox.kafka_properties = 'compression.type=zstd;topic.compression.codec=lz4;batch.num.messages=100;message.max.bytes=2000000';
ALTER SYSTEM RESET outbox.kafka_properties;
SELECT count(*) AS nothing_written FROM pg_file_settings WHERE name LIKE 'outbox.%' AND sourcefile LIKE '%auto.conf';
-- Superusers can read the secret-holding setting (roles without privileges cannot, see privileges).
SHOW outbox.kafka_properties;
-- Relay settings are not per session.
SET outbox.batch_size = 10;
SET outbox.workers = 2;
SET outbox.cloudevents_topics = 'billing.*';
SET outbox.message_timestamp = 'publish';
-- Nor per role: a role with no rights at all cannot set the relay's pacing for itself (the
-- SQLSTATEs only: the messages differ between majors).
CREATE ROLE settings_nobody;
SET ROLE settings_nobody;
\set VERBOSITY sqlstate
SET outbox.batch_linger = 0;
SELECT set_config('outbox.batch_linger', '0', false);
ALTER ROLE settings_nobody SET outbox.batch_linger = 0;
\set VERBOSITY default
RESET ROLE;
DROP ROLE settings_nobody;
SHOW outbox.batch_linger;
-- Per database instead: ALTER DATABASE ... SET outbox.workers (the launcher restarts that
-- database's workers with it); its bounds apply there too.
DO $$ BEGIN EXECUTE format('ALTER DATABASE %I SET outbox.workers = 33', current_database()); END $$;
DO $$ BEGIN EXECUTE format('ALTER DATABASE %I SET outbox.workers = 2', current_database()); END $$;
SELECT item FROM pg_db_role_setting, unnest(setconfig) AS item
WHERE setrole = 0 AND setdatabase = (SELECT oid FROM pg_database WHERE datname = current_database())
  AND item LIKE 'outbox.%';
DO $$ BEGIN EXECUTE format('ALTER DATABASE %I RESET outbox.workers', current_database()); END $$;

-- The defaults agree with PostgreSQL's: the launcher and outbox.max_workers fit in the built-in
-- max_worker_processes with room left for parallel query and other background workers.
SELECT b.boot_val::int AS default_max_workers, p.boot_val::int AS default_max_worker_processes,
       b.boot_val::int + 1 < p.boot_val::int AS default_budget_fits_with_room
FROM pg_settings b, pg_settings p
WHERE b.name = 'outbox.max_workers' AND p.name = 'max_worker_processes';

-- exactly_once's names go into Kafka's transactional.id, a group id and a prepared transaction's
-- gid: a bad one is refused when set (22023, nothing written), an unknown delivery too.
ALTER SYSTEM SET outbox.transactional_id_prefix = 'billing relay';
ALTER SYSTEM SET outbox.transactional_id_prefix = '';
ALTER SYSTEM SET outbox.progress_topic = 'progress:topic';
ALTER SYSTEM SET outbox.delivery = 'exactly-once';
SELECT count(*) AS outbox_lines_in_auto_conf
FROM pg_file_settings WHERE sourcefile LIKE '%postgresql.auto.conf' AND name LIKE 'outbox.%';
