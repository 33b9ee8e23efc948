-- Runnev Postgres sink: the consumer's cursor, the gaps it met, and the default table batches are
-- applied to. `runnev sink-postgres --init-schema` runs this file; `psql -f sql/sink.sql` works
-- as well. Idempotent.

-- The cursor of each (consumer, stream): the highest seq whose effects are committed. It is
-- updated in the same transaction as those effects, so a crash or a redelivery can neither lose
-- nor repeat one (batches with seq <= cursor are skipped inside the transaction).
CREATE TABLE IF NOT EXISTS runnev_sink_cursor (
    consumer    text        NOT NULL,
    stream      text        NOT NULL,
    cursor      bigint      NOT NULL DEFAULT 0,
    updated_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer, stream)
);

-- Seqs retention evicted before this consumer read them (SPEC §2.5): never skipped silently.
CREATE TABLE IF NOT EXISTS runnev_sink_gaps (
    consumer     text        NOT NULL,
    stream       text        NOT NULL,
    from_seq     bigint      NOT NULL,
    to_seq       bigint      NOT NULL,
    recorded_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer, stream, from_seq)
);

-- Where `runnev sink-postgres` puts batches unless --apply-sql says otherwise.
CREATE TABLE IF NOT EXISTS runnev_sink_batches (
    consumer  text   NOT NULL,
    stream    text   NOT NULL,
    seq       bigint NOT NULL,
    ts        bigint NOT NULL,
    payload   bytea  NOT NULL,
    PRIMARY KEY (consumer, stream, seq)
);
