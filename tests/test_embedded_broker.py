"""The embedded broker never hands a worker a half-written message: a consumer reading as fast
as it can while a producer writes gets every message whole."""

import threading
from queue import Empty

from kombu import Connection

from config.broker import Transport


def test_a_fast_consumer_gets_every_message_whole(tmp_path):
    options = {"data_folder_in": str(tmp_path), "data_folder_out": str(tmp_path), "polling_interval": 0}
    total, body = 500, "x" * 20_000  # large enough that a write is not instantaneous
    received, errors = [], []
    with Connection("filesystem://", transport=Transport, transport_options=options) as producer_conn:
        producer = producer_conn.default_channel
        producer.queue_declare("q")
        done = threading.Event()

        def consume():
            with Connection("filesystem://", transport=Transport, transport_options=options) as conn:
                channel = conn.default_channel
                while len(received) < total:
                    try:
                        received.append(channel._get("q"))
                    except Empty:
                        pass
                    except Exception as exc:  # noqa: BLE001 - a torn message fails to decode
                        errors.append(exc)
                        return
                    if done.is_set() and not any(p.name.endswith(".q.msg") for p in tmp_path.iterdir()):
                        break

        consumer = threading.Thread(target=consume)
        consumer.start()
        for i in range(total):
            producer._put("q", {"body": body, "n": i})
        done.set()
        consumer.join(60)
    assert errors == []
    assert sorted(m["n"] for m in received) == list(range(total))
    assert all(m["body"] == body for m in received)
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no partial files left


def test_a_message_is_visible_under_its_queue_name_only_once_complete(tmp_path, monkeypatch):
    """While the message is being written, no file the consumer would pick exists yet."""
    import builtins

    import kombu.transport.filesystem

    import config.broker

    visible_while_writing = []

    class Watched:
        def __init__(self, f):
            self.f = f

        def write(self, data):
            visible_while_writing.extend(p.name for p in tmp_path.iterdir() if p.name.endswith(".q.msg"))
            return self.f.write(data)

        def read(self, *args):
            return self.f.read(*args)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.f.close()

    def watched_open(path, mode, **kwargs):
        return Watched(builtins.open(path, mode, **kwargs))  # noqa: SIM115 - closed by Watched

    for module in (config.broker, kombu.transport.filesystem):  # whichever writes the message
        monkeypatch.setattr(module, "open", watched_open, raising=False)
    options = {"data_folder_in": str(tmp_path), "data_folder_out": str(tmp_path)}
    with Connection("filesystem://", transport=Transport, transport_options=options) as conn:
        conn.default_channel._put("q", {"n": 1})
        assert visible_while_writing == []
        assert [p.name.endswith(".q.msg") for p in tmp_path.iterdir()] == [True]
        assert conn.default_channel._get("q") == {"n": 1}
