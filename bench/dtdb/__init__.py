"""Minimal Django project for the django-tasks + django-tasks-db benchmark.

Settings read the scratch database from BENCH_DTDB_URL (set by bench/alt_django_tasks_db.py).
"""
