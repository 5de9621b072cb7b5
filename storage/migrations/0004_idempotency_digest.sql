-- The submission digest of an idempotency key's first admission, so that the key
-- reused for a different message is refused instead of answered as a retry. NULL in
-- rows written before (they count as retries).
ALTER TABLE sms_idempotency ADD COLUMN digest bigint;
