"""Internal: the engine's roles. Not a public API.

Data path, top to bottom:
  claims.pick      claim + enrich a batch           (sql/pick.sql, load_*.sql)
  executor         run one step outside any transaction, build its outcome entry
  flusher          group-commit outcome entries     (sql/flush.sql and riders)
  scheduler        one per queue: feeder, threads, back-off, wake-ups
  heartbeat        renew leases of held rows        (sql/heartbeat.sql)
  maintenance      reaper and GC sweeps             (sql/reap.sql, gc_*.sql)
  listener         LISTEN for wake-ups
  supervisor       hosts the roles of one process; `rundurable` starts it
"""
