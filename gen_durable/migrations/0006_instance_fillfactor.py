"""Leave free space in `gen_durable`'s pages (fillfactor 80).

An inline transition changes no indexed column, so Postgres can write it as a HOT
update (no new index entries, pruned within the page) — but only when the row's page
has room for the new version. With the default fillfactor of 100, inserts pack pages
full and almost no inline transition is HOT; with 80, most are, and every other
update (claims, outcomes) finds room on its own page too (bench/results/history.md,
"Round 8"). Applies to pages written from now on; existing pages keep their fill.
"""

from django.db import migrations

UP = "ALTER TABLE gen_durable SET (fillfactor = 80);"
DOWN = "ALTER TABLE gen_durable RESET (fillfactor);"


class Migration(migrations.Migration):
    dependencies = [("gen_durable", "0005_signal_dedup")]

    operations = [migrations.RunSQL(UP, DOWN)]
