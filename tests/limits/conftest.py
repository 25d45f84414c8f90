"""Fixtures of the limiter tests: every behaviour test runs on both backends."""

import functools
import os
import uuid

import pytest
from django.db import connection

from gen_durable.limiter import get_limiter

REDIS_URL = os.environ.get("GEN_DURABLE_TEST_REDIS", "redis://127.0.0.1:6379/0")


@functools.cache
def _redis_missing() -> str | None:
    """Why the Redis tests cannot run here (None when a Redis answers at REDIS_URL)."""
    import redis

    try:
        redis.Redis.from_url(REDIS_URL, socket_connect_timeout=2).ping()
    except redis.RedisError as exc:
        return (f"no Redis answers at {REDIS_URL} ({exc}); install the Debian package redis-server "
                "(scripts/test installs and starts it when run as root) or set GEN_DURABLE_TEST_REDIS")
    return None


def redis_client():
    """A client of the tests' Redis; skips the calling test when no Redis answers."""
    import redis

    if reason := _redis_missing():
        pytest.skip(reason)
    return redis.Redis.from_url(REDIS_URL)


@pytest.fixture(params=["postgres", "redis"])
def backend(request):
    if request.param == "redis" and (reason := _redis_missing()):
        pytest.skip(reason)
    return request.param


@pytest.fixture
def configure(backend, settings):
    """configure(rates={...}, gates={...}, **engine_keys) -> the limiter for those settings.

    Redis runs use a key prefix of their own, deleted at teardown (the server is shared).
    """
    prefix = f"gdtest:{uuid.uuid4().hex[:10]}:"

    def configure(rates=None, gates=None, **extra):
        cfg = {**settings.GEN_DURABLE, "RATE_LIMITS": rates or {}, "CONCURRENCY_LIMITS": gates or {}, **extra}
        if backend == "redis":
            cfg["LIMITER"] = {"BACKEND": "redis", "URL": REDIS_URL, "PREFIX": prefix}
        settings.GEN_DURABLE = cfg
        limiter = get_limiter()
        if backend == "redis":
            limiter.sync_config()  # as a worker's start-up does: the prefix's epoch
        return limiter

    configure.prefix = prefix
    configure.backend = backend
    yield configure
    if backend == "redis":
        client = redis_client()
        keys = list(client.scan_iter(match=prefix + "*"))
        if keys:
            client.delete(*keys)


def collapse(queue):
    """Make every runnable row of `queue` due now (a deferred row is otherwise invisible)."""
    with connection.cursor() as cur:
        cur.execute("UPDATE gen_durable SET eligible_at = now() WHERE queue = %s AND status = 'runnable'", [queue])


def rows(queue):
    with connection.cursor() as cur:
        cur.execute("SELECT id, status, locked_by, concurrency_shard, attempt, eligible_at > now() "
                    "FROM gen_durable WHERE queue = %s ORDER BY id", [queue])
        return cur.fetchall()


def buckets(kind="conc"):
    with connection.cursor() as cur:
        cur.execute("SELECT key, shard, capacity, available FROM gen_durable_buckets WHERE kind = %s "
                    "ORDER BY key, shard", [kind])
        return cur.fetchall()
