-- Room on every page for the one update each row of these tables gets, schema version 7.
--
-- sms_routed (a branch's outcome recorded), dlr_tracks (the branch resolved) and
-- dlr_correlations (a part's final state) are each updated about once per message, and
-- none of those updates changes an indexed column. PostgreSQL writes such an update as
-- a heap-only tuple, with no new index entries, only when the new row version fits on
-- the old one's page. Half of each page is kept free for it; page pruning reclaims the
-- old versions without a vacuum. Pages written before this version keep their fill.
ALTER TABLE sms_routed SET (fillfactor = 50);
ALTER TABLE dlr_tracks SET (fillfactor = 50);
ALTER TABLE dlr_correlations SET (fillfactor = 50);
