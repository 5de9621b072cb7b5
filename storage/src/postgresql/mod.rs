//! PostgreSQL backends (the DLR store). Being written.
