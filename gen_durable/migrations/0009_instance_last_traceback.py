"""Add `last_traceback`: the formatted traceback of the instance's last failed attempt.

Written by the same flush UPDATE that writes `last_error` (no statement more), bounded
to MAX_TRACEBACK_LENGTH characters (gen_durable/outcomes.py, 8192), cleared when a
reaper, a shutdown or a cancel sets a `last_error` that no exception raised. Adding a
nullable column without a default rewrites nothing (instant on a table of any size).
"""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("gen_durable", "0007_instance_fillfactor_50")]

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
    ]
