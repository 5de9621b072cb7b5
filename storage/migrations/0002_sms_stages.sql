-- Sendium outbound stages (pending, router-queue, routed-work), schema version 2.
--
-- Applied at startup like 0001 (embedded, recorded in `_sqlx_migrations`, under a
-- session advisory lock). Never edit an applied migration: add a new numbered file.
--
-- Times are milliseconds since the Unix epoch (bigint). Records, groups and routed
-- units are the same versioned CBOR envelopes the file stages store (bytea): one
-- encoding for every backend, checked by the same code.
--
-- Every row is live work: a message is inserted once when it is admitted and deleted
-- once when its source completes. The only rows kept past their work are completed
-- multipart groups (until their deadline) and idempotency keys (until their retention);
-- the indexes the hot path reads for them are partial or ordered by that deadline, so
-- their size follows the backlog, not the history.

-- Admitted messages and multipart parts, by id (UUIDv7: admission order).
CREATE TABLE sms_records (
    id          uuid    PRIMARY KEY,
    accepted_at bigint  NOT NULL,
    -- Whether the submission asked for a receipt (for the totals).
    receipt     boolean NOT NULL,
    record      bytea   NOT NULL
);

-- Ready units (a message, or a multipart group whose last part arrived or whose
-- deadline passed), in ready order. `seq` is taken from `sms_pending_totals.next_seq`,
-- whose row every unit-creating transaction locks first, so ready order is commit
-- order and a reader walking `seq` never skips a unit committed later with a lower one.
CREATE TABLE sms_units (
    seq         bigint   PRIMARY KEY,
    id          uuid     NOT NULL UNIQUE,
    -- The partition of the unit's work (a stable hash of account and destination
    -- number), for processes that share the database.
    partition   smallint NOT NULL,
    -- 0: deliver, 1: expired (an incomplete multipart group).
    disposition smallint NOT NULL,
    -- The member records' ids, 16 bytes each, in part order.
    members     bytea    NOT NULL,
    receipts    integer  NOT NULL
);
CREATE INDEX sms_units_partition ON sms_units (partition, seq);

-- Multipart groups: open ones while their parts arrive, completed ones until their
-- deadline (a part sent again is then recognised). `key` is the group key and its
-- number of parts; `prefix` the group key alone.
CREATE TABLE sms_groups (
    key      bytea   PRIMARY KEY,
    prefix   bytea   NOT NULL,
    open     boolean NOT NULL,
    deadline bigint  NOT NULL,
    state    bytea   NOT NULL
);
CREATE INDEX sms_groups_prefix ON sms_groups (prefix);
CREATE INDEX sms_groups_open_by_deadline ON sms_groups (deadline) WHERE open;
CREATE INDEX sms_groups_completed_by_deadline ON sms_groups (deadline) WHERE NOT open;

-- Idempotency keys of HTTP submissions, until their retention ends.
CREATE TABLE sms_idempotency (
    account    text   NOT NULL,
    key        text   NOT NULL,
    id         uuid   NOT NULL,
    expires_at bigint NOT NULL,
    PRIMARY KEY (account, key)
);
CREATE INDEX sms_idempotency_expiry ON sms_idempotency (expires_at);

-- Maintained totals of the pending stage, and the next ready seq. Its one row is also
-- the pending stage's write lock: every transaction that admits, completes or expires
-- locks it first, so the stage's writers (in every process) take turns.
CREATE TABLE sms_pending_totals (
    id               smallint PRIMARY KEY CHECK (id = 1),
    records          bigint   NOT NULL,
    receipt_requests bigint   NOT NULL,
    units            bigint   NOT NULL,
    next_seq         bigint   NOT NULL,
    -- How many partitions the units are spread over: every process on the database
    -- uses this number (it changes only while the stage is empty and one process runs).
    partitions       smallint NOT NULL
);
INSERT INTO sms_pending_totals VALUES (1, 0, 0, 0, 1, 16);

-- The router-queue stage: units selected for routing. Selection takes ready units
-- that are neither staged nor routed, so no selection cursor is stored: a process
-- that starts, or takes over a partition, scans its partitions' ready units from the
-- start and skips what another stage holds.
CREATE TABLE sms_staged (
    unit      uuid     PRIMARY KEY,
    seq       bigint   NOT NULL,
    partition smallint NOT NULL
);
CREATE INDEX sms_staged_partition ON sms_staged (partition, seq);

-- The routed-work stage: every branch routing gave a unit, and how far each got.
CREATE TABLE sms_routed (
    unit          uuid     PRIMARY KEY,
    partition     smallint NOT NULL,
    open_branches integer  NOT NULL,
    routed        bytea    NOT NULL
);
CREATE INDEX sms_routed_partition ON sms_routed (partition, unit);

-- Receipt deliveries as several processes claim them: each process claims the SMPP
-- receipts of the accounts bound to it (an account's due receipts, by this index) and
-- any HTTP receipt (by the second), so an account bound nowhere costs no claim a scan.
CREATE INDEX dlr_deliveries_smpp_due ON dlr_deliveries (account, due_at, id) WHERE smpp;
CREATE INDEX dlr_deliveries_http_due ON dlr_deliveries (due_at, id) WHERE NOT smpp;
