-- The Sendium outbox table (SQLite 3.31 or later), applied by the application in its
-- own database file: `sendium outbox schema --dialect sqlite [--table NAME]` prints
-- this file for another table name. Use WAL mode (`PRAGMA journal_mode = WAL`) and a
-- busy timeout of a few seconds on the application's connections.
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
    -- Order of relay (AUTOINCREMENT: an id is never reused after a delete).
    id               INTEGER PRIMARY KEY AUTOINCREMENT,
    -- The message's stable identity, a UUID in text (a random one by default).
    event_id         TEXT    NOT NULL UNIQUE DEFAULT (
                         lower(hex(randomblob(4))) || '-' || lower(hex(randomblob(2))) || '-4' ||
                         substr(lower(hex(randomblob(2))), 2) || '-' ||
                         substr('89ab', 1 + (abs(random()) % 4), 1) ||
                         substr(lower(hex(randomblob(2))), 2) || '-' || lower(hex(randomblob(6)))),
    -- The Sendium account the message belongs to (routing, receipts, limits).
    account          TEXT    NOT NULL,
    source_addr      TEXT    NOT NULL,
    destination_addr TEXT    NOT NULL,
    -- UTF-8 text: Sendium chooses GSM 7-bit or UCS2 and splits long text.
    body             TEXT    NOT NULL,
    -- Where the receipt is posted, as `callback_url` of `POST /v1/messages`.
    callback_url     TEXT,
    -- Messages with the same key are relayed in `id` order; one stuck group does not
    -- hold back the others.
    group_key        TEXT,
    created_at       TEXT    NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now')),
    -- The relay's own columns.
    -- pending: not yet admitted; relayed: admitted, kept for the source's `retention`;
    -- dead: refused permanently `max-attempts` times (`sendium outbox retry` revives it).
    status           TEXT    NOT NULL DEFAULT 'pending'
                     CHECK (status IN ('pending', 'relayed', 'dead')),
    attempts         INTEGER NOT NULL DEFAULT 0,
    -- A refused row waits until then before its next attempt (NULL: at once).
    next_attempt_at  TEXT,
    last_error       TEXT,
    relayed_at       TEXT
);

-- Partial indexes: the relay's cover only pending rows, so their size follows the
-- backlog, not the history.
CREATE INDEX sendium_outbox_pending ON sendium_outbox (id) WHERE status = 'pending';
-- A row of a group waits while an earlier row of its group waits for a retry.
CREATE INDEX sendium_outbox_pending_groups ON sendium_outbox (group_key, id)
    WHERE status = 'pending' AND group_key IS NOT NULL;
CREATE INDEX sendium_outbox_dead ON sendium_outbox (id) WHERE status = 'dead';
CREATE INDEX sendium_outbox_relayed ON sendium_outbox (relayed_at) WHERE status = 'relayed';
