"""The LLM reply cache and the one client that owns it. One job per module: :mod:`.client` (the
client, :class:`~hdeval.llm.cache.client.CachedBackend`, and the cache key), :mod:`.store` (the store
on diskcache and the reply table), :mod:`.codec` (how a reply is stored and read back with
bounds), :mod:`.guard` (what the SQLite files may hold, read-only reads, storage errors) and
:mod:`.check` (clear, check, repair). The cache directory is untrusted: keys and values are plain
data only, never pickled.
"""
