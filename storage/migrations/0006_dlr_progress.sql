-- Kannel progress reports in the DLR store, schema version 6.
--
-- A report to a Kannel dlr-url before the message's final receipt (type 8: the provider
-- accepted the submission; type 4: an intermediate receipt) is a delivery like a
-- receipt: a row of dlr_deliveries, claimed, retried and expired exactly as a receipt's.
-- Its row has no receipt (state, error and done_at NULL) and no inbound message; it has
-- the report instead:
--   progress  JSONB, in a shape owned by postgresql/dlr/records.rs (`StoredProgress`,
--             field `v` = 1), readable with psql:
--     {"v":1,"kind":8,"text":"ACK/","smsc":"upstream","foreign_id":"…","at":ms}
-- Every row written before this version is a receipt or an inbound message.

-- The content check of version 5 takes the third kind of row. NOT VALID as there: the
-- rows already there satisfy it.
ALTER TABLE dlr_deliveries
    ADD COLUMN progress jsonb,
    DROP CONSTRAINT dlr_deliveries_content,
    ADD CONSTRAINT dlr_deliveries_content CHECK (
        (inbound IS NULL AND progress IS NULL AND unit IS NOT NULL AND branch IS NOT NULL
             AND state IS NOT NULL AND error IS NOT NULL AND done_at IS NOT NULL)
        OR (inbound IS NOT NULL AND inbound_payload IS NOT NULL AND state IS NULL AND progress IS NULL)
        OR (progress IS NOT NULL AND inbound IS NULL AND state IS NULL)) NOT VALID;
