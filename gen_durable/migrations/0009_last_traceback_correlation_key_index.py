"""Add `last_traceback`, an index of every correlation key and one of failed rows (operator visibility).

`last_traceback`: the formatted traceback of the instance's last failed attempt.
Written by the same flush UPDATE that writes `last_error` (no statement more), bounded
to MAX_TRACEBACK_LENGTH characters (gen_durable/outcomes.py, 8192), cleared when a
reaper, a shutdown or a cancel sets a `last_error` that no exception raised. Adding a
nullable column without a default rewrites nothing (instant on a table of any size).

`gen_durable_correlation_key`: hash (correlation_key) WHERE correlation_key IS NOT NULL, so
`gd.get(key)` and the admin's search find a finished or failed instance by its key too
(the unique `gen_durable_correlation` holds only the keys of rows in their scope, the
live ones by default). Built CONCURRENTLY (the migration is not atomic): writers are
not blocked while it builds on a large table. Rows without a key are not in it. A hash
index (equality is all it serves) holds a 4-byte hash per key, so a key written before
keys were bounded (longer than a btree entry allows) cannot fail the migration or a write.

`gen_durable_failed`: (updated_at) WHERE status = 'failed', so the overview's chart
counts failures per minute from an index alone (as gen_durable_gc counts every finished
row); only failed rows are in it.
"""

from django.db import migrations, models


class Migration(migrations.Migration):
    atomic = False  # CREATE INDEX CONCURRENTLY cannot run inside a transaction
    dependencies = [("gen_durable", "0008_unknown_since")]

    operations = [
        migrations.RunSQL(
            "ALTER TABLE gen_durable ADD COLUMN last_traceback text",
            "ALTER TABLE gen_durable DROP COLUMN last_traceback",
            state_operations=[
                migrations.AddField(
                    model_name="instance",
                    name="last_traceback",
                    field=models.TextField(blank=True, editable=False, null=True),
                ),
            ],
        ),
        migrations.RunSQL(
            "CREATE INDEX CONCURRENTLY IF NOT EXISTS gen_durable_failed ON gen_durable (updated_at) "
            "WHERE status = 'failed'",
            "DROP INDEX CONCURRENTLY IF EXISTS gen_durable_failed",
        ),
        migrations.RunSQL(
            "CREATE INDEX CONCURRENTLY IF NOT EXISTS gen_durable_correlation_key ON gen_durable "
            "USING hash (correlation_key) WHERE correlation_key IS NOT NULL",
            "DROP INDEX CONCURRENTLY IF EXISTS gen_durable_correlation_key",
        ),
    ]
