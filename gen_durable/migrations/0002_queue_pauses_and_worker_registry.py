"""Operator tables: paused queues, the worker registry, and (queue, status) statistics.

- `gen_durable_queue_pauses`: one row per paused queue (`gd.pause_queue`); schedulers
  read it at most once a second, so a pause reaches every worker on every host and
  survives restarts.
- `gen_durable_workers`: one row per running `rundurable` process (id, host, pid, the
  queues it serves, started_at, last_seen refreshed by its heartbeat). The admin's
  overview uses it to tell which queues no live worker serves.
- `gen_durable_queue_status`: extended statistics (most common (queue, status) pairs),
  so the overview's per-queue counts of parked and terminal rows come from the planner's
  statistics instead of a scan; ANALYZE (autovacuum) keeps them current.
"""

import django.db.models.functions.datetime
from django.db import migrations, models

import gen_durable.models

UP = r"""
CREATE TABLE gen_durable_queue_pauses (
    queue     text PRIMARY KEY CHECK (queue <> ''),
    paused_at timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE gen_durable_workers (
    id         text PRIMARY KEY,
    host       text NOT NULL,
    pid        integer NOT NULL,
    queues     text[] NOT NULL,
    started_at timestamptz NOT NULL DEFAULT now(),
    last_seen  timestamptz NOT NULL DEFAULT now()
);

CREATE STATISTICS gen_durable_queue_status (mcv) ON queue, status FROM gen_durable;
"""

DOWN = r"""
DROP STATISTICS IF EXISTS gen_durable_queue_status;
DROP TABLE IF EXISTS gen_durable_workers;
DROP TABLE IF EXISTS gen_durable_queue_pauses;
"""


class Migration(migrations.Migration):
    dependencies = [("gen_durable", "0001_initial")]

    operations = [
        migrations.RunSQL(UP, DOWN),
        migrations.CreateModel(
            name="QueuePause",
            fields=[
                ("queue", models.TextField(primary_key=True, serialize=False)),
                ("paused_at", models.DateTimeField(db_default=django.db.models.functions.datetime.Now())),
            ],
            options={"db_table": "gen_durable_queue_pauses", "managed": False},
        ),
        migrations.CreateModel(
            name="Worker",
            fields=[
                ("id", models.TextField(primary_key=True, serialize=False)),
                ("host", models.TextField()),
                ("pid", models.IntegerField()),
                ("queues", gen_durable.models.TextArrayField()),
                ("started_at", models.DateTimeField(db_default=django.db.models.functions.datetime.Now())),
                ("last_seen", models.DateTimeField(db_default=django.db.models.functions.datetime.Now())),
            ],
            options={"db_table": "gen_durable_workers", "managed": False},
        ),
        migrations.CreateModel(
            name="QueueOverview",
            fields=[],
            options={"verbose_name": "queue overview", "verbose_name_plural": "queue overview",
                     "proxy": True, "indexes": [], "constraints": []},
            bases=("gen_durable.instance",),
        ),
    ]
