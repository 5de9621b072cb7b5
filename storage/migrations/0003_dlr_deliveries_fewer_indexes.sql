-- Receipt deliveries, schema version 3: one index less to maintain on every insert and
-- claim of a delivery.
--
-- `dlr_deliveries_smpp_due (account, due_at, id) WHERE smpp` (version 2) serves every
-- lookup of an account's SMPP deliveries that `dlr_deliveries_smpp_account (account)
-- WHERE smpp` served (waking an account's deliveries when it binds), through its leading
-- column, and better (its due time is in the index too).
DROP INDEX dlr_deliveries_smpp_account;
