"""Django's Redis cache with one connection pool per process.

Django keeps a cache object per thread and async context, and each object its own pool; under the
ASGI server every request runs in a new context, so each request would open (and resolve the
driver's metadata for) a new Redis connection, and each command build a new client. The
throttles and lockouts read the cache on every API request: the pool and its client are kept per
process and server address instead."""

from __future__ import annotations

import threading

from django.core.cache.backends.redis import RedisCache, RedisCacheClient

_pools: dict[tuple[str, int], object] = {}
_clients: dict[int, object] = {}
_lock = threading.Lock()


class _SharedPoolClient(RedisCacheClient):
    def get_client(self, key=None, *, write=False):
        # one client per pool: building a redis.Redis (its table of reply parsers) per command
        # costs more than the command
        pool = self._get_connection_pool(write)
        client = _clients.get(id(pool))
        if client is None:
            client = _clients[id(pool)] = self._client(connection_pool=pool)
        return client

    def _get_connection_pool(self, write):
        index = self._get_connection_pool_index(write)
        key = (self._servers[index], id(self._pool_class))
        pool = _pools.get(key)
        if pool is None:
            with _lock:
                pool = _pools.get(key)
                if pool is None:
                    pool = _pools[key] = self._pool_class.from_url(self._servers[index], **self._pool_options)
        return pool


class SharedPoolRedisCache(RedisCache):
    def __init__(self, server, params):
        super().__init__(server, params)
        self._class = _SharedPoolClient
