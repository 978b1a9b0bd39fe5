-- The prefix is reserved: a typo is an error, not a silently ignored placeholder. PostgreSQL 14
-- has no reserved prefixes (MarkGUCPrefixReserved is 15+): there the typo is accepted as a
-- placeholder (reserved_prefix_1.out), which is why this is a file of its own.
SET outbox.batchsize = 10;
