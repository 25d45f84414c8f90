-- written_here: did the caller's open transaction (or one of its savepoints) write the
-- current version of this row? (await_result: no worker can see such a row before the
-- commit, so waiting for it could only time out — results.UncommittedInstance.)
-- Params: id bigint. Index: primary key (one probe). No lock.
-- xmin is a 32-bit transaction id. Ours are the top-level id and the savepoints' ids
-- allocated after it, so an xmin at or above the top-level id (widened with its epoch)
-- that is still in progress and visible to us is ours: another open transaction's rows
-- are invisible, a finished one's are committed. No id assigned: we wrote nothing.
SELECT CASE WHEN s.t8 IS NULL OR s.xm < s.t8 %% 4294967296 THEN false
            ELSE pg_xact_status((s.t8 - s.t8 %% 4294967296 + s.xm)::text::xid8) = 'in progress' END
FROM (SELECT xmin::text::bigint AS xm, pg_current_xact_id_if_assigned()::text::bigint AS t8
      FROM gen_durable WHERE id = %(id)s) s
