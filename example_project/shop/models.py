from django.db import models


class BenchRow(models.Model):
    """One row written per job by the benchmarks' ORM-write workload (bench/)."""

    n = models.IntegerField()
    created = models.DateTimeField(auto_now_add=True)
