"""Cron schedules: one row per schedule holding its next tick (`gen_durable_schedules`).

The worker that fires a tick locks the row (`FOR UPDATE SKIP LOCKED`, only while
`next_run_at <= now()`) and advances `next_run_at` in the same transaction that
inserts the instance, so each tick fires once across every process and host.
"""

import django.db.models.functions.datetime
from django.db import migrations, models

UP = r"""
CREATE TABLE gen_durable_schedules (
    name             text PRIMARY KEY CHECK (name <> ''),
    cron             text NOT NULL,
    timezone         text NOT NULL,
    next_run_at      timestamptz NOT NULL,
    last_tick_at     timestamptz,
    last_run_at      timestamptz,
    last_instance_id bigint,
    last_error       text,
    updated_at       timestamptz NOT NULL DEFAULT now()
);
"""

DOWN = r"""
DROP TABLE IF EXISTS gen_durable_schedules;
"""


class Migration(migrations.Migration):
    dependencies = [("gen_durable", "0002_queue_pauses_and_worker_registry")]

    operations = [
        migrations.RunSQL(UP, DOWN),
        migrations.CreateModel(
            name="ScheduleState",
            fields=[
                ("name", models.TextField(primary_key=True, serialize=False)),
                ("cron", models.TextField()),
                ("timezone", models.TextField()),
                ("next_run_at", models.DateTimeField()),
                ("last_tick_at", models.DateTimeField(null=True)),
                ("last_run_at", models.DateTimeField(null=True)),
                ("last_instance_id", models.BigIntegerField(null=True)),
                ("last_error", models.TextField(null=True)),
                ("updated_at", models.DateTimeField(db_default=django.db.models.functions.datetime.Now())),
            ],
            options={"db_table": "gen_durable_schedules", "managed": False},
        ),
    ]
