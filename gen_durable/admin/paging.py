"""Internal: changelist paging that never counts a whole table of millions of rows.

Django's admin counts the filtered queryset for its paginator (`SELECT COUNT(*)`),
which reads every matching row. `EstimatedCountPaginator` asks the planner first
(EXPLAIN, no rows read): when it expects more than CAP rows the count shown is that
estimate ("about N"); otherwise it counts exactly, but at most CAP + 1 rows
(`SELECT count(*) FROM (… LIMIT CAP + 1)`).
"""

from __future__ import annotations

import json

from django.core.exceptions import EmptyResultSet
from django.core.paginator import Paginator
from django.db import connections
from django.utils.functional import cached_property

CAP = 10_000


def planner_rows(queryset) -> int:
    """The planner's row estimate for `queryset` (one EXPLAIN; reads no rows)."""
    qs = queryset.order_by().values("pk")
    try:
        sql, params = qs.query.sql_with_params()
    except EmptyResultSet:  # e.g. id__in=[]: Django knows without asking
        return 0
    with connections[qs.db].cursor() as cur:
        cur.execute("EXPLAIN (FORMAT JSON) " + sql, params)
        plan = cur.fetchone()[0]
    if isinstance(plan, str):
        plan = json.loads(plan)
    return int(plan[0]["Plan"]["Plan Rows"])


class EstimatedCountPaginator(Paginator):
    """A Paginator whose `count` is exact up to CAP and the planner's estimate beyond.

    `estimated` tells the template to say "about". Past the last real page a page
    is simply empty.
    """

    estimated = False

    @cached_property
    def count(self):
        qs = self.object_list
        estimate = planner_rows(qs)
        if estimate > CAP:
            self.estimated = True
            return estimate
        exact = qs.order_by().values("pk")[: CAP + 1].count()  # no annotation is computed to count
        if exact > CAP:
            self.estimated = True
            return max(estimate, exact)
        return exact
