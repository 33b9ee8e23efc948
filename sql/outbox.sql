-- Runnev transactional outbox: the table an application writes to in its own transactions, and
-- the relay's progress. `runnev outbox-relay --init-schema` runs this file (with `runnev_outbox`
-- replaced by its --table); `psql -f sql/outbox.sql` works as well. Idempotent.
--
-- An application writes, inside its business transaction:
--     INSERT INTO runnev_outbox (stream, payload) VALUES ('orders', '{"order": 42}'::bytea);
-- If that transaction rolls back, the row never existed: nothing is published.

CREATE TABLE IF NOT EXISTS runnev_outbox (
    -- Insertion order only. Not the stream seq: ids are handed out in nextval order, not in commit
    -- order, so a lower id can become visible after a higher one was relayed.
    id          bigserial   PRIMARY KEY,
    -- The Runnev stream (SPEC §1: 1-128 of [A-Za-z0-9._-], not . or ..).
    stream      text        NOT NULL CHECK (stream ~ '^[A-Za-z0-9._-]{1,128}$' AND stream NOT IN ('.', '..')),
    -- The batch payload, byte for byte.
    payload     bytea       NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now(),
    -- The batch's seq in its stream, assigned by the relay (NULL: not yet assigned). Written once;
    -- the relay publishes the row with exactly this seq, so a retry is answered duplicate: true.
    seq         bigint
);

-- Rows waiting for a seq, in insertion order.
CREATE INDEX IF NOT EXISTS runnev_outbox_pending ON runnev_outbox (id) WHERE seq IS NULL;
-- Rows with a seq, by stream: one row per (stream, seq).
CREATE UNIQUE INDEX IF NOT EXISTS runnev_outbox_stream_seq ON runnev_outbox (stream, seq) WHERE seq IS NOT NULL;

-- A queue table: every relayed row leaves dead tuples (the seq's update, then the removal), at
-- thousands of rows a second megabytes of them every second. Vacuum it after a fixed number of dead
-- rows rather than a fraction of the table, and without cost-based throttling, so the space is
-- reused before the table grows (the server's autovacuum_naptime still bounds how often any table
-- is visited: see the README).
ALTER TABLE runnev_outbox SET (
    autovacuum_vacuum_scale_factor = 0,
    autovacuum_vacuum_threshold = 20000,
    autovacuum_vacuum_cost_delay = 0
);

-- Per stream: the highest seq handed out and the highest seq the cluster acknowledged. Rows with
-- published_seq < seq <= assigned_seq are assigned but not (known to be) published: the relay
-- publishes them again after a crash, and the cluster answers duplicate: true for those it has.
CREATE TABLE IF NOT EXISTS runnev_outbox_progress (
    stream         text        PRIMARY KEY,
    assigned_seq   bigint      NOT NULL,
    published_seq  bigint      NOT NULL,
    updated_at     timestamptz NOT NULL DEFAULT now(),
    CHECK (published_seq <= assigned_seq)
);

-- Once a row has a seq its stream and payload are frozen: a different payload at the same seq
-- would be a seq_conflict, and the batch may already be in the stream.
CREATE OR REPLACE FUNCTION runnev_outbox_frozen() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'runnev_outbox row % has seq % and may be published: stream and payload cannot change',
        OLD.id, OLD.seq;
END $$;
DROP TRIGGER IF EXISTS runnev_outbox_frozen ON runnev_outbox;
CREATE TRIGGER runnev_outbox_frozen BEFORE UPDATE ON runnev_outbox FOR EACH ROW
    WHEN (OLD.seq IS NOT NULL AND (OLD.stream IS DISTINCT FROM NEW.stream OR OLD.payload IS DISTINCT FROM NEW.payload))
    EXECUTE FUNCTION runnev_outbox_frozen();

-- Wakes the relay (LISTEN runnev_outbox) when a transaction that inserted rows commits. The relay
-- also polls, so dropping this trigger only adds latency.
CREATE OR REPLACE FUNCTION runnev_outbox_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('runnev_outbox', '');
    RETURN NULL;
END $$;
DROP TRIGGER IF EXISTS runnev_outbox_notify ON runnev_outbox;
CREATE TRIGGER runnev_outbox_notify AFTER INSERT ON runnev_outbox FOR EACH STATEMENT
    EXECUTE FUNCTION runnev_outbox_notify();
