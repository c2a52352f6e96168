"""
The minion key store (``multimaster_keystore``) as another run holds it, for unit tests.
"""

import threading

import multimaster_keystore as ks


def holding_the_lock(mopts):
    """
    Another run (a thread with its own open file description) holding the store lock until the
    returned event is set.
    """
    held, release = threading.Event(), threading.Event()

    def hold():
        with ks.locked(mopts):
            held.set()
            release.wait(10)

    thread = threading.Thread(target=hold)
    thread.start()
    assert held.wait(5)
    return release, thread
