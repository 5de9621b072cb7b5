//! `publish`: the outbox row, inserted in the application's own transaction.

use sqlx::{Postgres, Row, Transaction};
use uuid::Uuid;

use crate::schema::TableName;

/// One SMS for Sendium to send once the transaction it is published in commits.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OutboxMessage {
    /// The message's stable identity (Sendium's idempotency key for its admission);
    /// `None`: the table's default gives a random one.
    pub event_id: Option<Uuid>,
    /// The Sendium account the message belongs to.
    pub account: String,
    pub source_addr: String,
    pub destination_addr: String,
    /// UTF-8 text; Sendium chooses the encoding and splits long text.
    pub body: String,
    /// Where Sendium posts the receipt.
    pub callback_url: Option<String>,
    /// Messages with the same key are sent in the order they were published.
    pub group_key: Option<String>,
}

impl OutboxMessage {
    pub fn new(
        account: impl Into<String>,
        source_addr: impl Into<String>,
        destination_addr: impl Into<String>,
        body: impl Into<String>,
    ) -> Self {
        Self {
            event_id: None,
            account: account.into(),
            source_addr: source_addr.into(),
            destination_addr: destination_addr.into(),
            body: body.into(),
            callback_url: None,
            group_key: None,
        }
    }

    pub fn event_id(mut self, id: Uuid) -> Self {
        self.event_id = Some(id);
        self
    }

    pub fn callback_url(mut self, url: impl Into<String>) -> Self {
        self.callback_url = Some(url.into());
        self
    }

    pub fn group_key(mut self, key: impl Into<String>) -> Self {
        self.group_key = Some(key.into());
        self
    }
}

/// The row a [`publish`] inserted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Published {
    /// Its place in relay order.
    pub id: i64,
    pub event_id: Uuid,
}

/// Why a message was not published. After [`PublishError::DuplicateEvent`] or
/// [`PublishError::Database`] PostgreSQL has aborted the transaction: roll it back.
#[derive(Debug, thiserror::Error)]
pub enum PublishError {
    /// Sendium would refuse the message for good; nothing was inserted.
    #[error("{0} is empty")]
    Empty(&'static str),
    /// A row with this event id is already in the outbox (published before, perhaps by
    /// a retried request): the message is not sent twice.
    #[error("event {0} is already in the outbox")]
    DuplicateEvent(Uuid),
    #[error("inserting into the outbox: {0}")]
    Database(#[source] sqlx::Error),
}

/// Insert `message` into the default table (`sendium_outbox`) in `tx`: Sendium sends it
/// once `tx` commits, and never if it rolls back.
pub async fn publish(tx: &mut Transaction<'_, Postgres>, message: &OutboxMessage) -> Result<Published, PublishError> {
    publish_to(tx, &TableName::default(), message).await
}

/// [`publish`] into the outbox table `table`.
pub async fn publish_to(
    tx: &mut Transaction<'_, Postgres>,
    table: &TableName,
    message: &OutboxMessage,
) -> Result<Published, PublishError> {
    for (field, value) in [
        ("account", &message.account),
        ("destination_addr", &message.destination_addr),
        ("body", &message.body),
    ] {
        if value.is_empty() {
            return Err(PublishError::Empty(field));
        }
    }
    // `table` is a checked identifier (see `TableName`), never user text.
    let sql = format!(
        "INSERT INTO {table} (event_id, account, source_addr, destination_addr, body, callback_url, group_key) \
         VALUES (coalesce($1, gen_random_uuid()), $2, $3, $4, $5, $6, $7) RETURNING id, event_id"
    );
    let row = sqlx::query(sqlx::AssertSqlSafe(sql))
        .bind(message.event_id)
        .bind(&message.account)
        .bind(&message.source_addr)
        .bind(&message.destination_addr)
        .bind(&message.body)
        .bind(&message.callback_url)
        .bind(&message.group_key)
        .fetch_one(&mut **tx)
        .await
        .map_err(|e| match (message.event_id, e.as_database_error()) {
            (Some(id), Some(db)) if db.is_unique_violation() => PublishError::DuplicateEvent(id),
            _ => PublishError::Database(e),
        })?;
    Ok(Published {
        id: row.try_get("id").map_err(PublishError::Database)?,
        event_id: row.try_get("event_id").map_err(PublishError::Database)?,
    })
}
