-- Sendium DLR store, schema version 1.
--
-- Applied at startup by `PostgresDlrStore::connect` (embedded in the binary with
-- include_str!, recorded in `_sqlx_migrations`, run under a session advisory lock so
-- several Sendium processes starting at once apply it exactly once). Never edit an
-- applied migration: add a new numbered file (and list it in postgresql/migrate.rs).
--
-- Times are milliseconds since the Unix epoch (bigint), as `Timestamp` keeps them.
-- Branch numbers are u16, so they are stored as integer, not smallint.
-- Receipt states are SMPP message_state numbers: 2 DELIVERED, 3 EXPIRED, 4 DELETED,
-- 5 UNDELIVERABLE, 6 ACCEPTED, 7 UNKNOWN, 8 REJECTED.
--
-- Receipt targets are JSONB (not CBOR): an operator can read them with psql, and the
-- resolution statement expands them into deliveries inside the database without a
-- round trip. Their shape is owned by postgresql/dlr.rs (`StoredTarget`, field `v` = 1):
--   {"v":1,"submit_id":"<uuid>","account":"esme1","reply":"smpp"|"http","url":"…",
--    "source":{"ton":5,"npi":0,"addr":"…"},"destination":{…},"submitted_at":ms,
--    "failure_only":false}

-- One row per (unit, branch) handed off: the message whose provider receipts we wait
-- for. Kept after resolution until `expires_at` (handoff + retention) so that a repeated
-- handoff is a no-op and a late duplicate receipt is recognised, never re-delivered.
CREATE TABLE dlr_tracks (
    unit          uuid     NOT NULL,
    branch        integer  NOT NULL,
    destination   text     NOT NULL,
    -- JSONB array of StoredTarget: one per submission owed a receipt.
    targets       jsonb    NOT NULL,
    -- Bumped when a resubmission replaces the provider ids; correlations carry the
    -- generation that created them, only the current one counts towards resolution.
    gen           integer  NOT NULL,
    -- Provider parts expected in the current generation, and how many are final.
    parts         integer  NOT NULL,
    parts_done    integer  NOT NULL DEFAULT 0,
    -- The first final failure (decides the message's state), if any.
    fail_state    smallint,
    fail_error    text,
    fail_done_at  bigint,
    -- Latest done_at of the current generation's parts (the DELIVRD receipt's time).
    last_done_at  bigint   NOT NULL DEFAULT 0,
    handed_off_at bigint   NOT NULL,
    -- NULL while awaiting receipts; set once, by the transaction that resolved it.
    resolved_at   bigint,
    expires_at    bigint   NOT NULL,
    PRIMARY KEY (unit, branch)
) WITH (fillfactor = 70);
-- fillfactor 70 (here and on dlr_correlations): receipts update these rows once or
-- twice without touching an indexed column, and free space on the page lets those be
-- HOT updates (no new index entries): about 2x faster receipt batches.
CREATE INDEX dlr_tracks_expiry ON dlr_tracks (expires_at);

-- The provider-id keyspace: one row per (destination, canonical provider id).
-- Either a correlation (unit set: the id belongs to that branch's part) or an orphan
-- (unit NULL: a receipt that arrived before its handoff, with its outcome).
-- Correlations and orphans share one primary key on purpose: a receipt storing an
-- orphan and a handoff storing the correlation for the same id conflict on it, so one
-- waits for the other and the later one sees the earlier — a receipt can never slip
-- between the two and stay orphaned next to its own correlation.
CREATE TABLE dlr_correlations (
    destination       text     NOT NULL,
    provider_key      text     NOT NULL,
    unit              uuid,
    branch            integer,
    -- Position of this id in the handoff's provider_keys (part order).
    part              integer,
    gen               integer,
    -- The part's final state once a receipt was accepted for it (or the orphan's).
    state             smallint,
    error             text,
    done_at           bigint,
    -- Orphans only: when an unmatched receipt is dropped.
    orphan_expires_at bigint,
    PRIMARY KEY (destination, provider_key),
    CONSTRAINT dlr_correlations_kind CHECK (
        (unit IS NOT NULL AND branch IS NOT NULL AND part IS NOT NULL AND gen IS NOT NULL
             AND orphan_expires_at IS NULL)
        OR (unit IS NULL AND state IS NOT NULL AND orphan_expires_at IS NOT NULL))
) WITH (fillfactor = 70);
CREATE INDEX dlr_correlations_track ON dlr_correlations (unit, branch) WHERE unit IS NOT NULL;
CREATE INDEX dlr_correlations_orphan_expiry ON dlr_correlations (orphan_expires_at) WHERE unit IS NULL;

-- Orphans as their own relation, for operators.
CREATE VIEW dlr_orphans AS
    SELECT destination, provider_key, state, error, done_at, orphan_expires_at AS expires_at
    FROM dlr_correlations WHERE unit IS NULL;

-- Pending downstream deliveries: one per receipt target of a resolved message.
-- Delivered and dead deliveries are deleted by `finish`, so every row is pending and
-- the due index needs no status predicate: a claimed row's due_at is its lease end,
-- so it drops out of the due range until the lease lapses.
CREATE TABLE dlr_deliveries (
    id          bigint   GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    unit        uuid     NOT NULL,
    branch      integer  NOT NULL,
    account     text     NOT NULL,
    -- reply = smpp: parked until the account binds, woken by wake_account.
    smpp        boolean  NOT NULL,
    target      jsonb    NOT NULL,
    state       smallint NOT NULL,
    error       text     NOT NULL,
    done_at     bigint   NOT NULL,
    -- Incremented by every claim; a result quoting another attempt is ignored.
    attempt     integer  NOT NULL DEFAULT 0,
    due_at      bigint   NOT NULL,
    lease_until bigint,
    created_at  bigint   NOT NULL,
    expires_at  bigint   NOT NULL
);
CREATE INDEX dlr_deliveries_due ON dlr_deliveries (due_at, id);
CREATE INDEX dlr_deliveries_expiry ON dlr_deliveries (expires_at);
CREATE INDEX dlr_deliveries_smpp_account ON dlr_deliveries (account) WHERE smpp;

-- Maintained counters for `stats`, which must stay cheap: count(*) over millions of
-- correlations would scan them all. Statement-level triggers with transition tables
-- record each statement's change in the same transaction, so the totals are exact.
-- They append a delta row instead of updating a shared total: an UPDATE would hold the
-- total's row lock until commit and serialize every writer (and could deadlock with
-- the row locks a transaction takes later); an INSERT conflicts with nothing.
-- `stats` reads the folded totals plus the unfolded deltas; `expire` folds them.
CREATE TABLE dlr_counters (
    id           integer PRIMARY KEY CHECK (id = 1),
    awaiting     bigint  NOT NULL DEFAULT 0,
    correlations bigint  NOT NULL DEFAULT 0,
    orphans      bigint  NOT NULL DEFAULT 0,
    deliveries   bigint  NOT NULL DEFAULT 0
);
INSERT INTO dlr_counters (id) VALUES (1);
CREATE TABLE dlr_counter_deltas (
    awaiting     bigint  NOT NULL,
    correlations bigint  NOT NULL,
    orphans      bigint  NOT NULL,
    deliveries   bigint  NOT NULL
);

CREATE FUNCTION dlr_count(d_awaiting bigint, d_correlations bigint, d_orphans bigint, d_deliveries bigint)
RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    IF d_awaiting <> 0 OR d_correlations <> 0 OR d_orphans <> 0 OR d_deliveries <> 0 THEN
        INSERT INTO dlr_counter_deltas VALUES (d_awaiting, d_correlations, d_orphans, d_deliveries);
    END IF;
END $$;

CREATE FUNCTION dlr_tracks_counted() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        PERFORM dlr_count((SELECT count(*) FROM new_rows WHERE resolved_at IS NULL), 0, 0, 0);
    ELSIF TG_OP = 'DELETE' THEN
        PERFORM dlr_count(-(SELECT count(*) FROM old_rows WHERE resolved_at IS NULL), 0, 0, 0);
    ELSE
        PERFORM dlr_count((SELECT count(*) FROM new_rows WHERE resolved_at IS NULL)
                          - (SELECT count(*) FROM old_rows WHERE resolved_at IS NULL), 0, 0, 0);
    END IF;
    RETURN NULL;
END $$;

CREATE FUNCTION dlr_correlations_counted() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        PERFORM dlr_count(0, (SELECT count(*) FROM new_rows WHERE unit IS NOT NULL),
                             (SELECT count(*) FROM new_rows WHERE unit IS NULL), 0);
    ELSIF TG_OP = 'DELETE' THEN
        PERFORM dlr_count(0, -(SELECT count(*) FROM old_rows WHERE unit IS NOT NULL),
                             -(SELECT count(*) FROM old_rows WHERE unit IS NULL), 0);
    ELSE
        PERFORM dlr_count(0, (SELECT count(*) FROM new_rows WHERE unit IS NOT NULL)
                             - (SELECT count(*) FROM old_rows WHERE unit IS NOT NULL),
                             (SELECT count(*) FROM new_rows WHERE unit IS NULL)
                             - (SELECT count(*) FROM old_rows WHERE unit IS NULL), 0);
    END IF;
    RETURN NULL;
END $$;

CREATE FUNCTION dlr_deliveries_counted() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        PERFORM dlr_count(0, 0, 0, (SELECT count(*) FROM new_rows));
    ELSE
        PERFORM dlr_count(0, 0, 0, -(SELECT count(*) FROM old_rows));
    END IF;
    RETURN NULL;
END $$;

-- One trigger per event: a trigger with transition tables may have only one event.
CREATE TRIGGER dlr_tracks_count_insert AFTER INSERT ON dlr_tracks
    REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION dlr_tracks_counted();
CREATE TRIGGER dlr_tracks_count_update AFTER UPDATE ON dlr_tracks
    REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION dlr_tracks_counted();
CREATE TRIGGER dlr_tracks_count_delete AFTER DELETE ON dlr_tracks
    REFERENCING OLD TABLE AS old_rows FOR EACH STATEMENT EXECUTE FUNCTION dlr_tracks_counted();

CREATE TRIGGER dlr_correlations_count_insert AFTER INSERT ON dlr_correlations
    REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION dlr_correlations_counted();
CREATE TRIGGER dlr_correlations_count_update AFTER UPDATE ON dlr_correlations
    REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION dlr_correlations_counted();
CREATE TRIGGER dlr_correlations_count_delete AFTER DELETE ON dlr_correlations
    REFERENCING OLD TABLE AS old_rows FOR EACH STATEMENT EXECUTE FUNCTION dlr_correlations_counted();

CREATE TRIGGER dlr_deliveries_count_insert AFTER INSERT ON dlr_deliveries
    REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION dlr_deliveries_counted();
CREATE TRIGGER dlr_deliveries_count_delete AFTER DELETE ON dlr_deliveries
    REFERENCING OLD TABLE AS old_rows FOR EACH STATEMENT EXECUTE FUNCTION dlr_deliveries_counted();
