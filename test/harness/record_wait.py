"""A lock wait inside a relay statement, on demand: a superuser's trigger makes the record
statement (the one UPDATE per batch) wait for an advisory lock the test holds. No relay
statement waits for a row lock (they skip rows others hold), so this is how a test makes one
wait, to end it by lock_timeout, statement_timeout, a cancel or a terminate."""

LOCK_ID = 4242


def make_record_wait(pg, dbname=None):
    """Creates the trigger; returns a connection holding the lock (close it to let the relay go)."""
    pg.sql(f"""
        CREATE FUNCTION public.wait_on_test_lock() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            IF NEW.status <> OLD.status THEN PERFORM pg_advisory_xact_lock({LOCK_ID}); END IF;
            RETURN NEW;
        END $$;
        CREATE TRIGGER wait_on_test_lock BEFORE UPDATE ON outbox.events
            FOR EACH ROW EXECUTE FUNCTION public.wait_on_test_lock();""", dbname=dbname)
    holder = pg.connect(dbname) if dbname else pg.connect()
    holder.execute("SELECT pg_advisory_lock(%s)", (LOCK_ID,))
    return holder


def drop_record_wait(pg, holder, dbname=None):
    pg.sql("DROP TRIGGER wait_on_test_lock ON outbox.events", dbname=dbname)
    holder.close()
