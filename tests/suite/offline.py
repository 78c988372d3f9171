"""A pytest plugin (`-p nosocket`, written out by the tests that use it) that refuses every
connection a run tries to open and prints how many were tried: a replay proves it is offline."""

NO_SOCKET = """
import socket

opened = []
saved = {}


def refuse(*args, **kwargs):
    opened.append(args)
    raise OSError("networking is disabled in this test run")


def pytest_configure(config):
    saved.update(connect=socket.socket.connect, connect_ex=socket.socket.connect_ex)
    saved.update(create_connection=socket.create_connection)
    socket.socket.connect = socket.socket.connect_ex = socket.create_connection = refuse


def pytest_unconfigure(config):
    socket.socket.connect, socket.socket.connect_ex = saved["connect"], saved["connect_ex"]
    socket.create_connection = saved["create_connection"]
    print(f"sockets opened: {len(opened)}")
"""
