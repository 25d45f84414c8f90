-- limiter_debit: apply one admission decision (second statement of the admission transaction).
-- Params: kind text[], key text[], shard int[], capacity float8[] (per-shard capacity from
--   the configuration), rate float8[] (per-shard tokens per second; 0 for gates),
--   taken float8[] (slots or tokens debited), mint bool[] (the shard does not exist yet);
--   ids bigint[], shards int[]: admitted gated rows and the shard each drew;
--   worker text: the claimant (stamps are guarded by it, like every write to a claimed row).
-- Existing shards were locked by limiter_lock in this transaction, so the arithmetic is
--   row-resident (available - taken). A rate shard refills first, with the same now() the
--   lock statement saw (one transaction, one now()); a sub-epsilon negative left by float
--   rounding is clamped to 0, anything larger is a real overdraft and violates the CHECK.
-- Returns the counts, then the ids actually stamped: an admitted row missing from them left
--   executing (a cancel or a reap) after its claim committed — the caller rolls this
--   transaction back and admits again without it, so no slot is debited for a row that
--   will never credit it.
-- Cold shards are minted here already debited (a cold bucket admits at once):
--   gates merge a racing mint (ON CONFLICT: available - taken; a combined overdraft violates
--   gen_durable_buckets_available and the caller retries); rate mints cannot merge (the refill
--   is config, not a column), so a racing rate mint violates the unique key and the caller
--   retries against the winner's row. Mints go in (key, shard) order.
WITH d AS (
    SELECT *
    FROM unnest(%(kind)s::text[], %(key)s::text[], %(shard)s::int[], %(capacity)s::float8[],
                %(rate)s::float8[], %(taken)s::float8[], %(mint)s::bool[])
         AS d(kind, key, shard, capacity, rate, taken, mint)
), debit AS (
    UPDATE gen_durable_buckets b
    SET available = CASE WHEN v.left_ < 0 AND v.left_ > -1e-9 THEN 0 ELSE v.left_ END,
        capacity = CASE WHEN b.kind = 'rate' THEN v.capacity ELSE b.capacity END,
        last_refill = CASE WHEN b.kind = 'rate' THEN now() ELSE b.last_refill END
    FROM (
        SELECT b2.id, d.capacity,
               CASE WHEN d.kind = 'rate'
                    THEN LEAST(d.capacity, b2.available
                               + GREATEST(extract(epoch FROM now() - COALESCE(b2.last_refill, now()))::float8, 0) * d.rate)
                    ELSE b2.available END - d.taken AS left_
        FROM d JOIN gen_durable_buckets b2 ON b2.kind = d.kind AND b2.key = d.key AND b2.shard = d.shard
        WHERE NOT d.mint
    ) v
    WHERE b.id = v.id
    RETURNING b.id
), gate_mint AS (
    INSERT INTO gen_durable_buckets AS b (kind, key, shard, capacity, available, last_refill)
    SELECT kind, key, shard, capacity, capacity - taken, now()
    FROM d WHERE mint AND kind = 'conc'
    ORDER BY key, shard
    ON CONFLICT (kind, key, shard) DO UPDATE
        SET available = b.available - (EXCLUDED.capacity - EXCLUDED.available)
    RETURNING b.id
), rate_mint AS (
    INSERT INTO gen_durable_buckets (kind, key, shard, capacity, available, last_refill)
    SELECT kind, key, shard, capacity, GREATEST(capacity - taken, 0), now()
    FROM d WHERE mint AND kind = 'rate'
    ORDER BY key, shard
    RETURNING id
), stamp AS (
    UPDATE gen_durable g
    SET concurrency_shard = s.shard
    FROM unnest(%(ids)s::bigint[], %(shards)s::int[]) AS s(id, shard)
    WHERE g.id = s.id AND g.locked_by = %(worker)s AND g.status = 'executing'
    RETURNING g.id
)
SELECT (SELECT count(*) FROM debit), (SELECT count(*) FROM gate_mint),
       (SELECT count(*) FROM rate_mint), (SELECT count(*) FROM stamp),
       (SELECT coalesce(array_agg(id), '{}') FROM stamp)
