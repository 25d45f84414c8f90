"""Add `gen_durable_signal_dedup`: the dedup keys delivered to each instance.

A signal's `dedup_key` stays delivered for the instance's whole life, consumed or not
(docs/design.md#signals). The inbox row that carried it is deleted when a step
consumes it, so the key is kept here: one narrow row per (instance, key), deleted with
the instance (ON DELETE CASCADE, i.e. by GC). Keys already in inboxes are copied over.
"""

from django.db import migrations

UP = r"""
CREATE TABLE gen_durable_signal_dedup (
    target_id bigint NOT NULL REFERENCES gen_durable (id) ON DELETE CASCADE,
    dedup_key text NOT NULL,
    PRIMARY KEY (target_id, dedup_key)
);
INSERT INTO gen_durable_signal_dedup (target_id, dedup_key)
SELECT target_id, dedup_key FROM gen_durable_signals WHERE dedup_key IS NOT NULL
ON CONFLICT DO NOTHING;
"""

DOWN = "DROP TABLE IF EXISTS gen_durable_signal_dedup;"


class Migration(migrations.Migration):
    dependencies = [("gen_durable", "0004_instance_attempt_log")]

    operations = [migrations.RunSQL(UP, DOWN)]
