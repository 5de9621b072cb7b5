-- Inbound (MO) messages in the DLR store, schema version 5.
--
-- An inbound message is a delivery like a receipt: a row of dlr_deliveries, claimed,
-- retried, scoped by SMPP account and expired exactly as a receipt's. Its row has no
-- receipt (state, error and done_at NULL) and no branch (unit and branch NULL); it has
-- the message instead:
--   inbound          JSONB, in a shape owned by postgresql/dlr/records.rs
--                    (`StoredInbound`, field `v` = 1), readable with psql:
--     {"v":1,"id":"<uuid>","from_destination":"smsc1",
--      "source":{"ton":1,"npi":1,"addr":"…"},"destination":{…},"data_coding":0,
--      "received_at":ms,"route":"support","incomplete":false}
--   inbound_payload  bytea: the text as encoded in data_coding, without UDH (binary,
--                    and often UCS-2: not JSON text; bytea also spares base64's third).
-- Receipt rows are unchanged; every row written before this version is a receipt.
--
-- Multipart inbound messages are held as parts until their group is written:
-- dlr_inbound_groups (one row per group) and dlr_inbound_parts (one row per part, same
-- message and payload columns). A group is due at due_at: 0 once it is complete or
-- closed, else its deadline; due_inbound_groups reads the (due_at, no) index only.
-- Parts of one group key are placed under a transaction-level advisory lock on the
-- key's hash (class 0x53444D4F, "SDMO"), so concurrent steps of several processes place
-- them one after the other; writing a group deletes its row, and only the transaction
-- whose DELETE returned it creates the message's delivery.

ALTER TABLE dlr_deliveries
    ALTER COLUMN unit DROP NOT NULL,
    ALTER COLUMN branch DROP NOT NULL,
    ALTER COLUMN state DROP NOT NULL,
    ALTER COLUMN error DROP NOT NULL,
    ALTER COLUMN done_at DROP NOT NULL,
    ADD COLUMN inbound jsonb,
    ADD COLUMN inbound_payload bytea,
    -- NOT VALID: the rows already there are receipts; checking them would read the
    -- whole table under this migration's lock for nothing.
    ADD CONSTRAINT dlr_deliveries_content CHECK (
        (inbound IS NULL AND unit IS NOT NULL AND branch IS NOT NULL AND state IS NOT NULL
             AND error IS NOT NULL AND done_at IS NOT NULL)
        OR (inbound IS NOT NULL AND inbound_payload IS NOT NULL AND state IS NULL)) NOT VALID;

-- Group numbers are taken in the step before its rows are written (parts name them).
CREATE SEQUENCE dlr_inbound_group_no AS bigint;

CREATE TABLE dlr_inbound_groups (
    no               bigint   PRIMARY KEY,
    from_destination text     NOT NULL,
    source           text     NOT NULL,
    destination      text     NOT NULL,
    reference        integer  NOT NULL,
    total            integer  NOT NULL,
    -- The first part's deadline (saved: a restart does not extend it).
    deadline         bigint   NOT NULL,
    -- Closed by a conflicting part: no longer its key's open group, due at once.
    closed           boolean  NOT NULL DEFAULT false,
    -- 0 once complete or closed, else the deadline.
    due_at           bigint   NOT NULL
);
-- At most one open group per key (the advisory lock is what orders writers; this says
-- what they must keep true).
CREATE UNIQUE INDEX dlr_inbound_groups_open
    ON dlr_inbound_groups (from_destination, source, destination, reference, total) WHERE NOT closed;
CREATE INDEX dlr_inbound_groups_due ON dlr_inbound_groups (due_at, no);

CREATE TABLE dlr_inbound_parts (
    group_no  bigint   NOT NULL,
    seq       integer  NOT NULL,
    deadline  bigint   NOT NULL,
    message   jsonb    NOT NULL,
    payload   bytea    NOT NULL,
    PRIMARY KEY (group_no, seq)
);

-- Parts held, for stats: maintained like the other counters (see 0001).
ALTER TABLE dlr_counters ADD COLUMN inbound_parts bigint NOT NULL DEFAULT 0;
ALTER TABLE dlr_counter_deltas ADD COLUMN inbound_parts bigint NOT NULL DEFAULT 0;

CREATE FUNCTION dlr_inbound_parts_counted() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    n bigint;
BEGIN
    IF TG_OP = 'INSERT' THEN
        n := (SELECT count(*) FROM new_rows);
    ELSE
        n := -(SELECT count(*) FROM old_rows);
    END IF;
    IF n <> 0 THEN
        INSERT INTO dlr_counter_deltas (awaiting, correlations, orphans, deliveries, inbound_parts)
        VALUES (0, 0, 0, 0, n);
    END IF;
    RETURN NULL;
END $$;

CREATE TRIGGER dlr_inbound_parts_count_insert AFTER INSERT ON dlr_inbound_parts
    REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION dlr_inbound_parts_counted();
CREATE TRIGGER dlr_inbound_parts_count_delete AFTER DELETE ON dlr_inbound_parts
    REFERENCING OLD TABLE AS old_rows FOR EACH STATEMENT EXECUTE FUNCTION dlr_inbound_parts_counted();
