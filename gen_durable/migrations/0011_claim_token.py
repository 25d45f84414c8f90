"""Add `gen_durable.claim`: a per-row claim counter, the token of the flush guard.

pick.sql increments it with every claim and the worker's outcome carries the value it
claimed; flush.sql commits an outcome only while the row still holds that claim
(docs/design.md#outcomes). `locked_by` names the worker, not the claim: after a cancel
and a retry the same worker may claim the row again while the cancelled run is still
in flight, and that run's late outcome must not commit over the new claim.

ADD COLUMN with a constant default and NOT NULL only writes the catalog (PostgreSQL
11+): no table rewrite, no index. The database default stays (db_default): the engine's
raw INSERTs (insert.sql, insert_all.sql) name no such column. The model is unmanaged
(migrations/0001_initial.py owns the DDL), as for every column since.
"""

from django.db import migrations

UP = "ALTER TABLE gen_durable ADD COLUMN claim bigint NOT NULL DEFAULT 0;"
DOWN = "ALTER TABLE gen_durable DROP COLUMN IF EXISTS claim;"


class Migration(migrations.Migration):
    dependencies = [("gen_durable", "0010_history")]

    operations = [migrations.RunSQL(UP, DOWN)]
