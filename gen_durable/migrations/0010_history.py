"""Add `gen_durable_history`: the timeline of an instance, one row per attempt that committed.

Written by the worker after the outcomes commit (sql/history_insert.sql: one INSERT of
arrays through unnest for the entries of many flushes — an entry never describes an
outcome that did not commit) and by the reaper for a lost attempt, trimmed by the GC sweep past HISTORY['RETENTION'] and beyond
HISTORY['MAX_PER_INSTANCE'] entries of one instance (sql/history_gc_*.sql). No foreign
key: an instance's GC deletes no history (its entries age out with it), and a write
here takes no lock on gen_durable.

`gen_durable_history_instance`: (instance_id, id), so "the latest N of one instance"
(the admin's timeline) reads N index entries backwards. New and empty: built inside the
migration's transaction, nothing to build concurrently.
"""

from django.db import migrations, models

CREATE = """
CREATE TABLE gen_durable_history (
    id bigserial PRIMARY KEY,
    instance_id bigint NOT NULL,
    attempt integer NOT NULL,
    step text NOT NULL,
    outcome text NOT NULL,
    error text,
    worker text,
    started_at timestamptz,
    finished_at timestamptz NOT NULL
);
CREATE INDEX gen_durable_history_instance ON gen_durable_history (instance_id, id);
"""


class Migration(migrations.Migration):
    dependencies = [("gen_durable", "0009_last_traceback_correlation_key_index")]

    operations = [
        migrations.RunSQL(
            CREATE,
            "DROP TABLE IF EXISTS gen_durable_history",
            state_operations=[
                migrations.CreateModel(
                    name="HistoryEntry",
                    fields=[
                        ("id", models.BigAutoField(primary_key=True, serialize=False)),
                        ("instance_id", models.BigIntegerField()),
                        ("attempt", models.IntegerField()),
                        ("step", models.TextField()),
                        ("outcome", models.TextField()),
                        ("error", models.TextField(blank=True, null=True)),
                        ("worker", models.TextField(blank=True, null=True)),
                        ("started_at", models.DateTimeField(blank=True, null=True)),
                        ("finished_at", models.DateTimeField()),
                    ],
                    options={"db_table": "gen_durable_history", "managed": False,
                             "verbose_name_plural": "history entries"},
                ),
            ],
        ),
    ]
