"""The schema of docs/design.md#schema, read back from the catalog, and the migrations' hygiene."""

import pytest
from django.core.management import call_command
from django.db import connection
from django.db.migrations.executor import MigrationExecutor


def _indexes():
    with connection.cursor() as cur:
        cur.execute("SELECT indexname, indexdef FROM pg_indexes WHERE tablename LIKE 'gen_durable%%'")
        return dict(cur.fetchall())


@pytest.mark.django_db
def test_every_index_exists_with_its_exact_predicate():
    idx = _indexes()
    expect = {
        "gen_durable_pick": "(queue, priority, eligible_at) WHERE (status = 'runnable'::gen_durable_status)",
        "gen_durable_lease": "(lease_expires_at) WHERE (status = 'executing'::gen_durable_status)",
        "gen_durable_await_deadline": "(await_deadline) WHERE ((status = 'awaiting_signal'::gen_durable_status) AND (await_deadline IS NOT NULL))",
        "gen_durable_concurrency_active": "(concurrency_key) WHERE ((status = 'executing'::gen_durable_status) AND (concurrency_key IS NOT NULL) AND (concurrency_shard IS NULL))",
        "gen_durable_correlation": "(correlation_guard) WHERE (correlation_guard IS NOT NULL)",
        "gen_durable_correlation_key": "USING hash (correlation_key) WHERE (correlation_key IS NOT NULL)",
        "gen_durable_failed": "(updated_at) WHERE (status = 'failed'::gen_durable_status)",
        "gen_durable_parent": "(parent_id) WHERE (parent_id IS NOT NULL)",
        "gen_durable_gc": "(updated_at) WHERE (status = ANY (ARRAY['done'::gen_durable_status, 'failed'::gen_durable_status]))",
        "gen_durable_signals_target": "(target_id, name)",
        "gen_durable_unknown": "(queue, fsm, fsm_version) WHERE ((unknown_since IS NOT NULL) AND (status = 'runnable'::gen_durable_status))",
    }
    for name, tail in expect.items():
        assert name in idx, f"missing index {name}"
        assert idx[name].endswith(tail), f"{name}: {idx[name]}"
    unique = {n for n, d in idx.items() if d.startswith("CREATE UNIQUE")}
    assert {"gen_durable_concurrency_active", "gen_durable_correlation", "gen_durable_signals_dedup",
            "gen_durable_buckets_kind_key_shard"} <= unique
    # Lock-strength safety: no full unique index over a mutable
    # column of gen_durable; the only full one is the primary key.
    full_unique = [n for n, d in idx.items() if d.startswith("CREATE UNIQUE") and " ON public.gen_durable " in d
                   and " WHERE " not in d]
    assert full_unique == ["gen_durable_pkey"]


@pytest.mark.django_db
def test_instance_table_leaves_room_for_hot_updates():
    """fillfactor 50 (migration 0007; 80 since 0006): the new versions of the rows of a
    page updated in one flush fit on that page, so an inline transition can be a HOT
    update (bench/results/history.md, rounds 8 and 10); the autovacuum settings of migration
    0001 stay."""
    with connection.cursor() as cur:
        cur.execute("SELECT reloptions FROM pg_class WHERE oid = 'gen_durable'::regclass")
        options = dict(o.split("=", 1) for o in cur.fetchone()[0])
    assert options["fillfactor"] == "50"
    assert options["autovacuum_vacuum_scale_factor"] == "0.01"


@pytest.mark.django_db
def test_constraints_and_on_delete_rules_are_enforced_by_the_database():
    with connection.cursor() as cur:
        cur.execute("""SELECT conname, contype, confdeltype, pg_get_constraintdef(oid)
                       FROM pg_constraint WHERE conrelid::regclass::text LIKE 'gen_durable%%'""")
        cons = {r[0]: r[1:] for r in cur.fetchall()}
    fk_parent = [v for k, v in cons.items() if v[0] == "f" and "REFERENCES gen_durable(id)" in v[2] and "parent_id" in v[2]]
    assert fk_parent and fk_parent[0][1] == "n"  # ON DELETE SET NULL
    fk_target = [v for k, v in cons.items() if v[0] == "f" and "target_id" in v[2]]
    assert fk_target and fk_target[0][1] == "c"  # ON DELETE CASCADE
    assert "CHECK (((available >= (0)::double precision) AND (available <= capacity)))" == cons["gen_durable_buckets_available"][2]
    assert cons["gen_durable_signals_dedup"][2] == "UNIQUE (target_id, dedup_key)"


@pytest.mark.django_db
def test_generated_columns_and_enum():
    with connection.cursor() as cur:
        cur.execute("""SELECT column_name, is_generated, generation_expression, udt_name
                       FROM information_schema.columns WHERE table_name = 'gen_durable'""")
        cols = {r[0]: r[1:] for r in cur.fetchall()}
        cur.execute("SELECT enum_range(NULL::gen_durable_status)::text")
        labels = cur.fetchone()[0]
    assert labels == "{runnable,executing,awaiting_signal,awaiting_children,done,failed}"
    assert cols["correlation_guard"][0] == "ALWAYS"
    assert "status = ANY (correlation_scope)" in cols["correlation_guard"][1]
    assert cols["concurrency_name"][0] == "ALWAYS"
    assert cols["status"][2] == "gen_durable_status"
    assert cols["correlation_scope"][2] == "_gen_durable_status"
    spec_columns = {
        "id", "fsm", "fsm_version", "step", "status", "state", "result", "awaits", "queue", "priority",
        "eligible_at", "concurrency_key", "concurrency_shard", "rate_limit", "weight", "locked_by",
        "lease_expires_at", "attempt", "last_error", "await_deadline", "parent_id", "children_pending",
        "correlation_key", "correlation_scope", "correlation_guard", "inserted_at", "updated_at",
    }
    assert spec_columns <= set(cols)


@pytest.mark.django_db
def test_no_missing_migrations():
    call_command("makemigrations", "gen_durable", "--check", "--dry-run", verbosity=0)


@pytest.mark.django_db(transaction=True)
def test_migrations_reverse_and_reapply_cleanly():
    executor = MigrationExecutor(connection)
    executor.migrate([("gen_durable", None)])
    with connection.cursor() as cur:
        cur.execute("SELECT to_regclass('gen_durable'), to_regtype('gen_durable_status')")
        assert cur.fetchone() == (None, None)
    executor = MigrationExecutor(connection)
    executor.migrate(executor.loader.graph.leaf_nodes("gen_durable"))
    with connection.cursor() as cur:
        cur.execute("SELECT to_regclass('gen_durable')::text")
        assert cur.fetchone() == ("gen_durable",)
