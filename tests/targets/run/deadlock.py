"""Two threads that take two locks in opposite orders: a deadlock at the `with other` line."""

import threading
import time

first, second = threading.Lock(), threading.Lock()


def take(one: threading.Lock, other: threading.Lock) -> None:
    with one:
        time.sleep(0.5)
        with other:  # WAIT_LINE
            pass


orders = ((first, second), (second, first))
pairs = [threading.Thread(target=take, args=locks, name=f"pair-{i}") for i, locks in enumerate(orders)]
for thread in pairs:
    thread.start()
for thread in pairs:
    thread.join()
