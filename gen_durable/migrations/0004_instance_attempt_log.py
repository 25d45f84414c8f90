"""Add `attempt_log`: one JSON record per finished attempt, for rows that keep one.

Django Tasks (gen_durable.tasks) report every attempt's worker, start time and error;
the engine itself stores only the latest error. The column is NULL for every other
row, and adding a nullable column without a default rewrites nothing (instant on a
table of any size).
"""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("gen_durable", "0003_cron_schedules")]

    operations = [
        migrations.RunSQL(
            "ALTER TABLE gen_durable ADD COLUMN attempt_log jsonb",
            "ALTER TABLE gen_durable DROP COLUMN attempt_log",
            state_operations=[
                migrations.AddField(
                    model_name="instance",
                    name="attempt_log",
                    field=models.JSONField(blank=True, editable=False, null=True),
                ),
            ],
        ),
    ]
