"""Whether a lock is free to other threads: the tests that check that no
round's lock is held across a slow call (an etcd request, a report's
checks) take it from a second thread while the call is under way."""
import threading


def free_elsewhere(lock) -> bool:
    """Whether another thread can take `lock` now (an RLock is always
    free to the thread that holds it)."""
    got = []

    def take():
        ok = lock.acquire(timeout=0.2)
        got.append(ok)
        if ok:
            lock.release()
    t = threading.Thread(target=take)
    t.start()
    t.join()
    return got[0]
