"""The readers-writer lock that keeps read-only tests out of swaps, across processes (flock)."""

import fcntl
import os
import threading

import pytest

from pytest_rlrollout.remote.lock import DeploymentLock


def test_an_exclusive_holder_keeps_readers_out_until_it_lets_go(tmp_path):
    lock = DeploymentLock("http://x|accounts/a/deployments/d", tmp_path)
    held, released, read = threading.Event(), threading.Event(), threading.Event()
    order = []

    def writer():
        with lock.exclusive():
            order.append("swap starts")
            held.set()
            released.wait(timeout=10)
            order.append("swap ends")

    def reader():
        held.wait(timeout=10)
        with lock.shared():  # a separate open file: flock conflicts as between processes
            order.append("read")
            read.set()

    threads = [threading.Thread(target=writer), threading.Thread(target=reader)]
    for t in threads:
        t.start()
    held.wait(timeout=10)
    fd = os.open(lock.path, os.O_RDWR)
    try:  # a reader now would have to wait: a non-blocking shared lock is refused
        with pytest.raises(BlockingIOError):
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    finally:
        os.close(fd)
    assert not read.is_set()
    released.set()
    for t in threads:
        t.join(timeout=10)
    assert order == ["swap starts", "swap ends", "read"]


def test_readers_share(tmp_path):
    lock = DeploymentLock("key", tmp_path)
    with lock.shared(), lock.shared():
        pass
    assert DeploymentLock("key", tmp_path).path == lock.path != DeploymentLock("other", tmp_path).path
