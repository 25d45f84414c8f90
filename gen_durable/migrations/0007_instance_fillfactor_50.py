"""Leave half of each `gen_durable` page free (fillfactor 50; 80 since migration 0006).

The rows claimed in one pick sit side by side (inserted together) and are updated
together: every row of a page needs room for its new version at the same flush. At
fillfactor 80 a page had room for about a fifth of them; the others moved to other
pages, with new index entries and the extension of the table. At 50 nearly every row's
next version fits on its own page: an inline transition is a HOT update (94 % of them
in the 20,000-step drain, 59 % at 80: no index entries) and a claim or an outcome stays
on its page; the previous versions are pruned within the page (bench/results/history.md,
"Round 10"). Applies to pages written from now on; existing pages keep their fill until
rewritten.
"""

from django.db import migrations

UP = "ALTER TABLE gen_durable SET (fillfactor = 50);"
DOWN = "ALTER TABLE gen_durable SET (fillfactor = 80);"


class Migration(migrations.Migration):
    dependencies = [("gen_durable", "0006_instance_fillfactor")]

    operations = [migrations.RunSQL(UP, DOWN)]
