"""A naive LRU cache written independently of the project's code: the
oracle the exact and fallback LRU curves are checked against."""
from collections import OrderedDict


def naive_lru_miss_ratio(keys, size):
    """Misses / accesses of an LRU cache of `size` entries over `keys`."""
    cache, misses = OrderedDict(), 0
    for k in keys:
        if k in cache:
            cache.move_to_end(k)
        else:
            misses += 1
            cache[k] = True
            if len(cache) > size:
                cache.popitem(last=False)
    return misses / len(keys)
