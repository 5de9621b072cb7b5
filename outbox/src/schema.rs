//! The outbox table's SQL, for the table name an application chooses.

use std::fmt;
use std::str::FromStr;

/// The table's name unless the application chooses another.
pub const DEFAULT_TABLE: &str = "sendium_outbox";

const POSTGRESQL: &str = include_str!("../sql/postgresql.sql");
const SQLITE: &str = include_str!("../sql/sqlite.sql");

/// The database the outbox table lives in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dialect {
    Postgresql,
    Sqlite,
}

impl Dialect {
    pub fn as_str(self) -> &'static str {
        match self {
            Dialect::Postgresql => "postgresql",
            Dialect::Sqlite => "sqlite",
        }
    }
}

impl fmt::Display for Dialect {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A dialect name other than `postgresql` or `sqlite`.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("unknown dialect {0:?}: expected postgresql or sqlite")]
pub struct UnknownDialect(pub String);

impl FromStr for Dialect {
    type Err = UnknownDialect;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "postgresql" | "postgres" => Ok(Dialect::Postgresql),
            "sqlite" => Ok(Dialect::Sqlite),
            other => Err(UnknownDialect(other.to_owned())),
        }
    }
}

/// A table name usable unquoted in both dialects, short enough that the names derived
/// from it (`<table>_pending`, `<table>_notify`, …) stay within PostgreSQL's 63 bytes.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct TableName(String);

/// Longest table name: 63 bytes less the longest derived suffix (`_pending_groups`).
pub const MAX_TABLE_NAME: usize = 63 - "_pending_groups".len();

/// Why a table name was refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum TableNameError {
    #[error("table name is empty")]
    Empty,
    #[error("table name {0:?} is longer than {MAX_TABLE_NAME} bytes")]
    TooLong(String),
    #[error(
        "table name {0:?} must start with a lowercase letter or '_' and contain only lowercase letters, digits and '_' (to schema-qualify it, set the search path of the connection instead)"
    )]
    Invalid(String),
}

impl TableName {
    pub fn new(name: &str) -> Result<Self, TableNameError> {
        let mut chars = name.chars();
        let Some(first) = chars.next() else {
            return Err(TableNameError::Empty);
        };
        if name.len() > MAX_TABLE_NAME {
            return Err(TableNameError::TooLong(name.to_owned()));
        }
        let ok_first = first.is_ascii_lowercase() || first == '_';
        if !ok_first || !chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_') {
            return Err(TableNameError::Invalid(name.to_owned()));
        }
        Ok(Self(name.to_owned()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl Default for TableName {
    fn default() -> Self {
        Self(DEFAULT_TABLE.to_owned())
    }
}

impl fmt::Display for TableName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl FromStr for TableName {
    type Err = TableNameError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::new(s)
    }
}

/// The SQL that creates the outbox table `table` (its indexes, and on PostgreSQL the
/// trigger that wakes the relay), to apply in the application's own database.
pub fn schema(dialect: Dialect, table: &TableName) -> String {
    let text = match dialect {
        Dialect::Postgresql => POSTGRESQL,
        Dialect::Sqlite => SQLITE,
    };
    // Every name in the files derives from the default table name: the table, its
    // indexes, constraint, function, trigger and notification channel.
    text.replace(DEFAULT_TABLE, table.as_str())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_names_are_checked() {
        assert!(TableName::new("sms_outbox").is_ok());
        assert!(TableName::new("_x1").is_ok());
        assert_eq!(TableName::new(""), Err(TableNameError::Empty));
        for bad in [
            "Outbox",
            "1outbox",
            "sms-outbox",
            "app.outbox",
            "x; DROP TABLE y",
            "\"q\"",
        ] {
            assert_eq!(
                TableName::new(bad),
                Err(TableNameError::Invalid(bad.to_owned())),
                "{bad}"
            );
        }
        let long = "a".repeat(MAX_TABLE_NAME + 1);
        assert_eq!(TableName::new(&long), Err(TableNameError::TooLong(long.clone())));
        assert!(TableName::new(&long[1..]).is_ok());
    }

    #[test]
    fn dialects_parse() {
        assert_eq!("postgresql".parse(), Ok(Dialect::Postgresql));
        assert_eq!("sqlite".parse(), Ok(Dialect::Sqlite));
        assert_eq!("mysql".parse::<Dialect>(), Err(UnknownDialect("mysql".into())));
    }

    #[test]
    fn another_name_renames_everything() {
        let table = TableName::new("order_sms").unwrap();
        for dialect in [Dialect::Postgresql, Dialect::Sqlite] {
            let sql = schema(dialect, &table);
            assert!(!sql.contains(DEFAULT_TABLE), "{dialect}: {sql}");
            assert!(sql.contains("CREATE TABLE order_sms ("), "{dialect}");
            assert!(sql.contains("CREATE INDEX order_sms_pending ON order_sms (id) WHERE status = 'pending'"));
        }
        assert_eq!(schema(Dialect::Sqlite, &TableName::default()), SQLITE);
    }
}
