"""Rows a worker did not know wait, untouched, for a worker that knows them.

During a rolling deploy a worker of the old release may claim a row of a machine,
version or step only the new release defines. It hands the row back instead of failing
it (docs/guide.md, "Deploying"): status `runnable`, attempt and `last_error` as they
were, `unknown_since` = when it was handed back, and `eligible_at` far in the future so
that no pick meets it again. A worker that knows the row makes it eligible again
(`sql/adopt_known.sql`, `eligible_at := unknown_since`) and clears the mark; its pick
then claims it like any row.

`gen_durable_unknown` holds only such rows (none outside a deploy): the adoption probe,
the overview's "rows wait for a worker that knows X vN" and the worker's
once-a-second "any to adopt?" read are index probes of it, never scans.
"""

from django.db import migrations

UP = """
ALTER TABLE gen_durable ADD COLUMN unknown_since timestamptz;
CREATE INDEX gen_durable_unknown ON gen_durable (queue, fsm, fsm_version)
    WHERE unknown_since IS NOT NULL AND status = 'runnable';
"""
DOWN = """
DROP INDEX IF EXISTS gen_durable_unknown;
ALTER TABLE gen_durable DROP COLUMN IF EXISTS unknown_since;
"""


class Migration(migrations.Migration):
    dependencies = [("gen_durable", "0007_instance_fillfactor_50")]

    operations = [migrations.RunSQL(UP, DOWN)]
