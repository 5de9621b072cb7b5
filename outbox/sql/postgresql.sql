-- The Sendium outbox table (PostgreSQL 13 or later), applied by the application in its
-- own database: `sendium outbox schema --dialect postgresql [--table NAME]` prints this
-- file for another table name.
--
-- The application inserts only the message columns, in the same transaction as the
-- business change the SMS belongs to:
--
--   INSERT INTO sendium_outbox (account, source_addr, destination_addr, body)
--   VALUES ('shop', 'Shop', '447700900123', 'Order 1042 is paid.');
--
-- Sendium relays committed rows in `id` order (per `group_key` when one is given) and
-- admits each with `event_id` as its idempotency key, so a row relayed twice after a
-- crash is admitted once. No credentials live here: `account` names a Sendium account.

CREATE TABLE sendium_outbox (
    -- Order of relay.
    id               bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    -- The message's stable identity (Sendium's idempotency key for its admission).
    event_id         uuid        NOT NULL DEFAULT gen_random_uuid(),
    -- The Sendium account the message belongs to (routing, receipts, limits).
    account          text        NOT NULL,
    source_addr      text        NOT NULL,
    destination_addr text        NOT NULL,
    -- UTF-8 text: Sendium chooses GSM 7-bit or UCS2 and splits long text.
    body             text        NOT NULL,
    -- Where the receipt is posted, as `callback_url` of `POST /v1/messages`.
    callback_url     text,
    -- Messages with the same key are relayed in `id` order; one stuck group does not
    -- hold back the others.
    group_key        text,
    created_at       timestamptz NOT NULL DEFAULT now(),
    -- The relay's own columns.
    -- Which relay lane takes the row (lane modulo the source's `partitions`): rows of a
    -- group share a lane, so one worker keeps their order.
    lane             integer     NOT NULL
                     GENERATED ALWAYS AS (hashtext(coalesce(group_key, event_id::text)) & 1023) STORED,
    -- pending: not yet admitted; relayed: admitted, kept for the source's `retention`;
    -- dead: refused permanently `max-attempts` times (`sendium outbox retry` revives it).
    status           text        NOT NULL DEFAULT 'pending'
                     CHECK (status IN ('pending', 'relayed', 'dead')),
    attempts         integer     NOT NULL DEFAULT 0,
    -- A refused row waits until then before its next attempt (NULL: at once).
    next_attempt_at  timestamptz,
    last_error       text,
    relayed_at       timestamptz,
    CONSTRAINT sendium_outbox_event_id_key UNIQUE (event_id)
);

-- Partial indexes: the relay's cover only pending rows, so their size follows the
-- backlog, not the history.
CREATE INDEX sendium_outbox_pending ON sendium_outbox (id) WHERE status = 'pending';
-- A row of a group waits while an earlier row of its group waits for a retry.
CREATE INDEX sendium_outbox_pending_groups ON sendium_outbox (group_key, id)
    WHERE status = 'pending' AND group_key IS NOT NULL;
CREATE INDEX sendium_outbox_dead ON sendium_outbox (id) WHERE status = 'dead';
CREATE INDEX sendium_outbox_relayed ON sendium_outbox (relayed_at) WHERE status = 'relayed';

-- Keeps a group's commit order equal to its id order: an insert of a row with a
-- group_key waits for any other open transaction that inserted a row of the same group,
-- and takes its id only then. Without it, two concurrent transactions could commit a
-- group's rows in the other order than their ids, and the relay could send the later
-- one first. Rows without a group_key are not ordered and take no lock.
CREATE FUNCTION sendium_outbox_order() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.group_key IS NOT NULL THEN
        PERFORM pg_advisory_xact_lock(hashtext('sendium-outbox-group:sendium_outbox'), hashtext(NEW.group_key));
        NEW.id := nextval(pg_get_serial_sequence('sendium_outbox', 'id'));
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER sendium_outbox_order BEFORE INSERT ON sendium_outbox
    FOR EACH ROW EXECUTE FUNCTION sendium_outbox_order();

-- Wakes the relay (LISTEN on the table's name) when a transaction that inserted rows
-- commits, once per lane it inserted into, so only the worker of that lane wakes; the
-- relay also polls, so a missed notification only delays.
CREATE FUNCTION sendium_outbox_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('sendium_outbox', l.lane::text)
       FROM (SELECT DISTINCT lane FROM sendium_outbox_inserted) AS l;
    RETURN NULL;
END $$;
CREATE TRIGGER sendium_outbox_notify AFTER INSERT ON sendium_outbox
    REFERENCING NEW TABLE AS sendium_outbox_inserted
    FOR EACH STATEMENT EXECUTE FUNCTION sendium_outbox_notify();
